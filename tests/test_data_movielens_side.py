"""MovieLens side features on tiny hand-written users and items files of both formats; the
expected ids are worked out by hand in the comments."""
import json
import sys

import numpy as np
import pytest

import jobs
from hetu.data import DataFormatError, load_dataset, prepare_movielens
from hetu.data.movielens_side import GENRES_100K

# ratings, file order: (196, 242), (186, 302), (22, 377), (196, 377), (22, 242)
U_DATA = "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n" \
         "196\t377\t4\t881250950\n22\t242\t5\t878887117\n"

# User 5 rates nothing: its values (F... other, 33, T) are not numbered.
U_USER = "22|25|M|writer|40206\n186|39|F|executive|00000\n196|49|M|writer|55105\n" \
         "5|33|F|other|T8H1N\n"
# 1M: the same users with age buckets and occupation codes; occupation 7 comes before 12 (numbers
# by value, not as text), so the local ids are those of the 100K file.
USERS_DAT = "22::M::25::12::40206\n186::F::35::7::00000\n196::M::45::12::55105-3307\n" \
            "5::F::18::1::T8H1N\n"


def u_item_line(item, title, release_date, *genres):
    flags = ["1" if name in genres else "0" for name in GENRES_100K]
    return "|".join([str(item), title, release_date, "", "http://us.imdb.com/x"] + flags) + "\n"


U_ITEM = (u_item_line(242, "Kolya (1996)", "24-Jan-1997", "Comedy")
          + u_item_line(302, "L.A. Confidential (1997)", "01-Jan-1997", "Crime", "Film-Noir",
                        "Mystery", "Thriller")
          + u_item_line(377, "Heavyweights (1994)", "", "Children's", "Comedy")
          + u_item_line(9, "Misérables, Les (1995)", "01-Jan-1995", "Drama"))
MOVIES_DAT = ("242::Kolya (1997)::Comedy\n"
              "302::L.A. Confidential (a.k.a. LA) (1997)::Crime|Film-Noir|Mystery|Thriller\n"
              "377::Heavyweights::Children's|Comedy\n"
              "9::Misérables, Les (1995)::Drama\n")

# Field sizes and offsets: user 3 [0], item 3 [3], gender 2 [6] (F, M), age 3 [8],
# occupation 2 [11] (executive/7, writer/12), zip 3 [13] (0, 4, 5), year 2 [16] (1997, unknown),
# genres 6 [18] (Children's, Comedy, Crime, Film-Noir, Mystery, Thriller), 4 slots.
USER_SIDE = {22: [7, 8, 12, 14], 186: [6, 9, 11, 13], 196: [7, 10, 12, 15]}
ITEM_SIDE = {242: [16, 19, -1, -1, -1], 302: [16, 20, 21, 22, 23], 377: [17, 18, 19, -1, -1]}
USER_ITEM = [(196, 242, 2, 3), (186, 302, 1, 4), (22, 377, 0, 5), (196, 377, 2, 5), (22, 242, 0, 3)]
EXPECTED_SPARSE = np.array([[u, i] + USER_SIDE[user] + ITEM_SIDE[item]
                            for user, item, u, i in USER_ITEM], dtype=np.int64)
FIELD_NAMES = ["user", "item", "gender", "age", "occupation", "zip", "year", "genres"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))   # as GroupLens ships them
    return path


def prepare(tmp_path, users, items, output="out", **options):
    return prepare_movielens(write(tmp_path, "u.data", U_DATA), tmp_path / output,
                             users_path=users, items_path=items, shuffle_seed=None,
                             progress=False, **options)


@pytest.mark.parametrize("users_name, users_text, items_name, items_text", [
    ("u.user", U_USER, "u.item", U_ITEM),
    ("users.dat", USERS_DAT, "movies.dat", MOVIES_DAT),
], ids=["100K", "1M"])
def test_side_fields_of_both_formats(tmp_path, users_name, users_text, items_name, items_text):
    out = prepare(tmp_path, write(tmp_path, users_name, users_text),
                  write(tmp_path, items_name, items_text))
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), EXPECTED_SPARSE)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["field_names"] == FIELD_NAMES
    assert meta["field_sizes"] == [3, 3, 2, 3, 2, 3, 2, 6]
    assert meta["field_offsets"] == [0, 3, 6, 8, 11, 13, 16, 18] and meta["num_embeddings"] == 24
    assert meta["field_slots"] == [1, 1, 1, 1, 1, 1, 1, 4] and meta["bag_fields"] == ["genres"]
    values = meta["side_features"]["field_values"]
    assert values["gender"] == ["F", "M"] and values["zip"] == ["0", "4", "5"]
    assert values["year"] == ["1997", "unknown"]
    assert values["genres"] == ["Children's", "Comedy", "Crime", "Film-Noir", "Mystery", "Thriller"]
    assert values["occupation"] == (["executive", "writer"] if users_name == "u.user" else ["7", "12"])
    assert values["age"] == (["25", "39", "49"] if users_name == "u.user" else ["25", "35", "45"])
    assert meta["source"]["users_path"].endswith(users_name)
    assert meta["source"]["items_path"].endswith(items_name)


def test_genres_bag_view_and_checker(tmp_path):
    out = prepare(tmp_path, write(tmp_path, "u.user", U_USER), write(tmp_path, "u.item", U_ITEM),
                  val_fraction=0.2)
    dataset = load_dataset(out)
    assert dataset.meta.bag_fields == ("genres",) and dataset.meta.slot_offsets[-2:] == (7, 11)
    values, offsets = dataset.train.bag("genres")
    # rows 0-3: Kolya {Comedy}, L.A. Confidential {Crime, Film-Noir, Mystery, Thriller},
    # Heavyweights {Children's, Comedy} twice
    np.testing.assert_array_equal(values, [19, 20, 21, 22, 23, 18, 19, 18, 19])
    np.testing.assert_array_equal(offsets, [0, 1, 5, 7, 9])
    for part in (dataset.train, dataset.val):
        part.checker("sparse")(np.asarray(part.sparse), np.arange(len(part)))


def test_time_order_moves_the_side_columns_with_their_rating(tmp_path):
    users, items = write(tmp_path, "u.user", U_USER), write(tmp_path, "u.item", U_ITEM)
    out = prepare(tmp_path, users, items, time_order=True)
    by_time = [2, 4, 0, 3, 1]
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), EXPECTED_SPARSE[by_time])
    cli = run_cli("movielens", "--input", tmp_path / "u.data", "--users", users, "--items", items,
                  "--time-order", "--output", tmp_path / "cli", "--quiet")
    assert cli.returncode == 0, cli.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "cli" / "sparse.npy"),
                                  EXPECTED_SPARSE[by_time])


def test_users_file_alone_adds_no_bag(tmp_path):
    out = prepare(tmp_path, write(tmp_path, "u.user", U_USER), None)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["field_names"] == FIELD_NAMES[:6]
    assert "field_slots" not in meta and "bag_fields" not in meta
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), EXPECTED_SPARSE[:, :6])


def test_without_side_files_the_output_is_as_before(tmp_path):
    out = prepare(tmp_path, None, None)
    meta = json.loads((out / "meta.json").read_text())
    assert sorted(meta) == ["extra_files", "field_names", "field_offsets", "field_sizes",
                            "format_version", "id_dtype", "label", "name", "num_dense",
                            "num_embeddings", "num_fields", "num_rows", "raw_id_ranges",
                            "source", "split"]
    assert meta["field_names"] == ["user", "item"] and meta["field_sizes"] == [3, 3]
    assert sorted(meta["source"]) == ["bad_lines_skipped", "kind", "order", "path",
                                      "skip_bad_lines", "truncated"]
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), EXPECTED_SPARSE[:, :2])


@pytest.mark.parametrize("users_text, items_text, message", [
    # user 186 (rating line 2) left out of the users file
    (U_USER.replace("186|39|F|executive|00000\n", ""), U_ITEM,
     r"u\.data:2: user 186 is not in \S*u\.user$"),
    # item 377 (first rated on line 3) left out of the items file
    (U_USER, U_ITEM.replace(u_item_line(377, "Heavyweights (1994)", "", "Children's", "Comedy"), ""),
     r"u\.data:3: item 377 is not in \S*u\.item$"),
], ids=["user", "item"])
def test_a_rating_the_side_files_lack_names_file_and_line(tmp_path, users_text, items_text, message):
    with pytest.raises(DataFormatError, match=message):
        prepare(tmp_path, write(tmp_path, "u.user", users_text), write(tmp_path, "u.item", items_text))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, text, message", [
    ("u.user", U_USER.replace("186|39|F|", "186|39|"), r"u\.user:2: expected 5 '\|'-separated columns"),
    ("u.user", U_USER.replace("|F|executive", "|X|executive"), r"u\.user:2: column 3: gender must be F or M, found 'X'"),
    ("u.user", U_USER.replace("|49|", "|old|"), r"u\.user:3: column 2: expected an age, found 'old'"),
    ("u.user", U_USER.replace("|writer|40206", "||40206"), r"u\.user:1: column 4: empty occupation"),
    ("u.user", U_USER + "22|30|M|artist|12345\n", r"u\.user:5: column 1: user 22 is already described on line 1"),
    ("users.dat", USERS_DAT.replace("::35::", "::3a::"), r"users\.dat:2: column 3: expected an age"),
    ("users.dat", USERS_DAT.replace("196::", "x196::"), r"users\.dat:3: column 1: expected a user id, found 'x196'"),
    ("u.item", U_ITEM.replace("|01-Jan-1997|", "|1997|"), r"u\.item:2: column 3: expected a release date"),
    ("u.item", U_ITEM.replace("|0\n", "|2\n", 1), r"u\.item:1: column 24: genre flag \(Western\) must be 0 or 1"),
    ("u.item", U_ITEM.replace("|http://us.imdb.com/x", "", 1), r"u\.item:1: expected 24 '\|'-separated columns, found 23"),
    ("movies.dat", MOVIES_DAT.replace("::Crime|", "::Crime||"), r"movies\.dat:2: column 3: empty genre name"),
    ("movies.dat", MOVIES_DAT.replace("377::Heavyweights::", "377::Heavyweights"), r"movies\.dat:3: expected 3 '::'-separated"),
    ("movies.dat", "242 Kolya (1996) Comedy\n", r"movies\.dat:1: neither a 100K"),
], ids=["user-columns", "gender", "age", "occupation", "repeated-user", "1M-age", "1M-user-id", "release-date",
        "genre-flag", "item-columns", "empty-genre", "1M-item-columns", "no-format"])
def test_a_malformed_side_line_names_file_and_line(tmp_path, name, text, message):
    users = write(tmp_path, name, text) if name in ("u.user", "users.dat") else write(tmp_path, "u.user", U_USER)
    items = write(tmp_path, name, text) if name in ("u.item", "movies.dat") else write(tmp_path, "u.item", U_ITEM)
    with pytest.raises(DataFormatError, match=message):
        prepare(tmp_path, users, items)


def test_cli_reports_a_missing_user_with_exit_status_2(tmp_path):
    users = write(tmp_path, "u.user", U_USER.replace("22|25|M|writer|40206\n", ""))
    proc = run_cli("movielens", "--input", write(tmp_path, "u.data", U_DATA), "--users", users,
                   "--output", tmp_path / "cli", "--quiet")
    assert proc.returncode == 2 and "u.data:3: user 22 is not in" in proc.stderr
    assert not (tmp_path / "cli").exists()


def run_cli(*args):
    return jobs.run([sys.executable, "-m", "hetu.data.prepare", *map(str, args)],
                    capture_output=True, text=True, timeout=60)
