"""TensorFlow Serving's REST API over a bundle (docs/design.md section 16): its URLs, its model
status and metadata documents, its row ("instances") and columnar ("inputs") request forms, {"b64":
...} strings, "signature_name", and its answers to malformed requests, status codes and texts
included, as TensorFlow Serving's handler gives them (its api_rest.md and its handler's tests).

A bundle has one signature, "serving_default" (method tensorflow/serving/predict), built from its
schema.json: a CTR bundle one input per raw column and the output "probability"; a sequential
model's bundle the inputs "history", "timestamps" and "k" and the outputs "items" and "scores".
An input with a default (MovieLens' "release_date", a history's "k", SASRec's "timestamps") may be
left out. Everything here is pure: the server (hetu.serve.server) reads the body and runs the model."""
import base64
import binascii
import json
import re
import urllib.parse

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
METHOD_NAMES = {"classify": "tensorflow/serving/classify", "regress": "tensorflow/serving/regress"}
SIGNATURE_KINDS = {"classify": "classification", "regress": "regression"}
DEFAULT_LABELS = ("stable",)
INT64_MAX = (1 << 63) - 1
VARIABLE = -1   # a dimension of any size: the batch, a history's length

# TensorFlow Serving's URL forms (model_servers/http_rest_api_util.cc), case-insensitive as there.
API = re.compile(r"/v1/.*", re.I)
PREDICTION = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)", re.I)
STATUS = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(?:/(metadata))?", re.I)
STATS = re.compile(r"/v1/models/([^/:]+)/stats")   # this server's own: the batching counters


class RestError(Exception):
    """A request answered with `status` and {"error": message}."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class Route:
    """What a /v1 URL asks: `action` (predict, classify, regress, status, metadata, stats), the model's
    `name`, and the `version` (an int) or `label` it pins, if any."""

    def __init__(self, action, name, version=None, label=None):
        self.action, self.name, self.version, self.label = action, name, version, label


def route(method, path):
    """The Route of `method` on the raw (still %-encoded) `path`; None for a path outside /v1/ (404).
    A /v1 path no API has is a RestError 400 "Malformed request", as TensorFlow Serving answers."""
    if not API.fullmatch(path):
        return None
    if method == "GET" and STATS.fullmatch(path):
        return Route("stats", urllib.parse.unquote(STATS.fullmatch(path).group(1)))
    found = (PREDICTION if method == "POST" else STATUS).fullmatch(path) if method in ("GET", "POST") else None
    if found is None:
        raise RestError(400, f"Malformed request: {method} {path}")
    name, version, label, action = found.groups()
    if version is not None:
        if int(version) > INT64_MAX:
            raise RestError(400, f"Failed to convert version: {version} to numeric.")
        version = int(version)
    name = urllib.parse.unquote(name) if name else ""
    label = urllib.parse.unquote(label) if label else None
    if method == "POST":
        if action not in ("predict", "classify", "regress"):   # the verb itself is matched exactly
            raise RestError(400, f"Malformed request: {method} {path}")
    else:
        action = "metadata" if action == "metadata" else "status"
        if not name:
            raise RestError(400, "Missing model name in request.")
    return Route(action, name, version, label)


def resolve(r, bundle, labels):
    """Checks that `r` asks for the model and version `bundle` is: a label must name the served
    version (400 otherwise), another model or version is 404, in TensorFlow Serving's words.
    Without a bundle (--watch before its first checkpoint) every model is one of no version
    loaded, which TensorFlow Serving answers 404 (its model status: no versions found; the rest:
    no servable)."""
    if bundle is None:
        if r.action == "status":
            raise RestError(404, f"Could not find any versions of model {r.name}" if r.version is None
                            else f"Could not find version {r.version} of model {r.name}")
        raise not_found(r)
    if r.label is not None and (r.name != bundle.name or r.label not in labels):
        raise RestError(400, f"Unrecognized servable version label: {r.label}")
    if r.name == bundle.name and r.version in (None, bundle.version):
        return
    if r.action == "status":
        raise RestError(404, f"Could not find any versions of model {r.name}" if r.version is None
                        else f"Could not find version {r.version} of model {r.name}")
    raise not_found(r)


def not_found(r):
    asked = f"Latest({r.name})" if r.version is None else f"Specific({r.name}, {r.version})"
    return RestError(404, f"Servable not found for request: {asked}")


def status(bundle):
    return {"model_version_status": [{"version": str(bundle.version), "state": "AVAILABLE",
                                      "status": {"error_code": "OK", "error_message": ""}}]}


# ---- the signature --------------------------------------------------------------------------

class Signature:
    """`inputs` and `outputs`: {name: (dtype, shape)}; `defaults`: {input: (dtype, shape, values)},
    the inputs a request may leave out; `strings`: the DT_STRING inputs (which take {"b64": ...})."""

    def __init__(self, inputs, outputs, defaults):
        self.inputs, self.outputs, self.defaults = inputs, outputs, defaults
        self.strings = {name for name, (dtype, _) in inputs.items() if dtype == "DT_STRING"}


def signature(bundle):
    schema = bundle.schema
    if schema.get("kind") == "sequences":
        from .sequences import DEFAULT_K
        inputs = {"history": ("DT_INT64", (VARIABLE, VARIABLE)), "timestamps": ("DT_INT64", (VARIABLE, VARIABLE)),
                  "k": ("DT_INT64", (VARIABLE,))}
        defaults = {"k": ("DT_INT64", (), [DEFAULT_K])}
        if not schema["timestamps"]:   # SASRec does not read them: none is an empty list
            defaults["timestamps"] = ("DT_INT64", (0,), [])
        return Signature(inputs, {"items": ("DT_INT64", (VARIABLE, VARIABLE)),
                                  "scores": ("DT_FLOAT", (VARIABLE, VARIABLE))}, defaults)
    inputs, defaults = {}, {}
    for column in schema["columns"]:
        ids = column.get("value") == "id"
        if column["kind"] == "dense":
            dtype = "DT_INT64" if column.get("value") == "integer" else "DT_FLOAT"
        else:
            dtype = "DT_INT64" if ids else "DT_STRING"
        # A bag of ids is a list; a bag of text its separator-joined text (or a list of strings).
        inputs[column["name"]] = (dtype, (VARIABLE, VARIABLE) if column["kind"] == "bag" and ids else (VARIABLE,))
        if column.get("derive") == "title_year":   # MovieLens 100K's release date, read before the title's year
            inputs["release_date"] = ("DT_STRING", (VARIABLE,))
            defaults["release_date"] = ("DT_STRING", (), [""])
    return Signature(inputs, {"probability": ("DT_FLOAT", (VARIABLE,))}, defaults)


def _shape(shape):
    return {"dim": [{"size": str(size), "name": ""} for size in shape], "unknown_rank": False}


def _tensor(dtype, shape, values):
    """A TensorProto in protobuf's JSON form (int64 as text, bytes as base64)."""
    key = {"DT_INT64": "int64_val", "DT_STRING": "string_val"}[dtype]
    if dtype == "DT_STRING":
        values = [base64.b64encode(v.encode()).decode() for v in values]
    else:
        values = [str(v) for v in values]
    return {"dtype": dtype, "tensor_shape": _shape(shape), key: values}


def metadata(bundle):
    """GET .../metadata: TensorFlow Serving's GetModelMetadataResponse of the bundle."""
    sig = signature(bundle)

    def infos(tensors):
        return {name: {"dtype": dtype, "tensor_shape": _shape(shape), "name": name}
                for name, (dtype, shape) in tensors.items()}
    definition = {"inputs": infos(sig.inputs), "outputs": infos(sig.outputs), "method_name": PREDICT_METHOD,
                  "defaults": {name: _tensor(*default) for name, default in sig.defaults.items()}}
    return {"model_spec": {"name": bundle.name, "signature_name": "", "version": str(bundle.version)},
            "metadata": {"signature_def": {"signature_def": {DEFAULT_SIGNATURE: definition}}}}


# ---- requests -------------------------------------------------------------------------------

def signature_name(document):
    """The request's "signature_name" ("" when absent); not a string is a 400."""
    name = document.get("signature_name", "")
    if not isinstance(name, str):
        raise RestError(400, "'signature_name' key must be a string value.")
    return name


def check_predict_signature(name):
    if name not in ("", DEFAULT_SIGNATURE):
        raise RestError(400, f'Serving signature name: "{name}" not found in signature def')


def check_examples(document, action):
    """A :classify or :regress body's "examples", checked before the model is looked up."""
    examples = document.get("examples")
    if examples is None:
        raise RestError(400, f"When method is {action}, key 'examples' is expected and was not found")
    if not isinstance(examples, list):
        raise RestError(400, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise RestError(400, "'examples' value is an empty array")
    for example in examples:
        if not isinstance(example, dict):
            raise RestError(400, f"Example must be JSON object but got JSON {_json_type(example)}")


def no_signature_for(action, name):
    """A bundle has only a predict signature: :classify and :regress are 400, as TensorFlow Serving
    answers for a model without them."""
    if name not in ("", DEFAULT_SIGNATURE):
        return RestError(400, f"No signature was found with the name: {name}")
    return RestError(400, f"Expected {SIGNATURE_KINDS[action]} signature method_name to be {METHOD_NAMES[action]}. "
                          f"Was: {PREDICT_METHOD}")


def instances_of(document, sig, lenient=False, b64=True):
    """(instances: a list of {column: raw value}, columnar: whether the request used "inputs") of a
    predict body. Strict as TensorFlow Serving: "instances" or "inputs", not both; no empty
    "instances"; an instance's column the signature does not have is a 400 (`lenient`: ignored,
    and empty "instances" answered with none). `b64`: whether {"b64": ...} values are looked for
    (False where the body has no "b64" at all)."""
    has_rows, has_columns = "instances" in document, "inputs" in document
    if has_rows and has_columns:
        raise RestError(400, "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist")
    if has_rows:
        return _rows(document["instances"], sig, lenient, b64), False
    if has_columns:
        return _columns(document["inputs"], sig, b64), True
    raise RestError(400, "Missing 'inputs' or 'instances' key: the body is {\"instances\": [{column: raw value, ...}, "
                         "...]} or {\"inputs\": {column: [value, ...], ...}}")


def _rows(rows, sig, lenient, b64):
    if not isinstance(rows, list):
        raise RestError(400, f"Expecting 'instances' to be an list/array, not a JSON {_json_type(rows)}")
    if not rows and not lenient:
        raise RestError(400, "No values in 'instances' array")
    single = next(iter(sig.inputs)) if len(sig.inputs) == 1 else None
    instances = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or _is_b64(row):
            if single is None:
                raise RestError(400, f"instance {i} is a JSON {_json_type(row)}, not an object {{column: raw value, "
                                     f"...}}: the model has {len(sig.inputs)} inputs")
            row = {single: row}
        elif not lenient and not row.keys() <= sig.inputs.keys():
            unknown = next(name for name in row if name not in sig.inputs)
            raise RestError(400, f"instance {i}: unknown column {unknown!r}: the model's inputs are "
                                 f"{', '.join(sig.inputs)} (--lenient ignores others)")
        instances.append(_decoded(row, i, sig) if b64 else row)
    return instances


def _columns(columns, sig, b64):
    if not isinstance(columns, dict) or _is_b64(columns):
        if len(sig.inputs) > 1:
            raise RestError(400, "inputs is a plain value/list, but expecting an object as multiple input tensors "
                                 f"required as per tensorinfo_map ({', '.join(sig.inputs)})")
        columns = {next(iter(sig.inputs)): columns}
    given, count, first = {}, None, None
    for name in sig.inputs:   # others are ignored, as TensorFlow Serving does
        if name not in columns:
            if name in sig.defaults:
                continue
            raise RestError(400, f"Missing named input: {name} in 'inputs' object.")
        values = columns[name]
        if not isinstance(values, list):
            if name in sig.defaults:   # one value for every instance (a history's K, say)
                given[name] = values
                continue
            raise RestError(400, f"input {name!r}: a list of one value per instance, not a JSON {_json_type(values)}")
        if count is None:
            count, first = len(values), name
        elif len(values) != count:
            raise RestError(400, f"input {name!r} has {len(values)} values, input {first!r} {count}: each input "
                                 f"holds one value per instance")
        given[name] = values
    rows = [{name: values[i] if isinstance(values, list) else values for name, values in given.items()}
            for i in range(count or 0)]
    return [_decoded(row, i, sig) for i, row in enumerate(rows)] if b64 else rows


def _decoded(row, i, sig):
    """`row` with its DT_STRING inputs' {"b64": ...} values (and those in a bag's list) decoded."""
    for name in sig.strings.intersection(row):
        value = row[name]
        if isinstance(value, dict):
            row[name] = _text(value, i, name)
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            row[name] = [_text(v, i, name) for v in value]
    return row


def _text(value, i, name):
    if not isinstance(value, dict):
        return value
    if not _is_b64(value):
        raise RestError(400, f"instance {i}: column {name!r}: an object not formatted correctly for base64 data "
                             f'({{"b64": "<base64 text>"}})')
    text = value["b64"].strip()
    try:
        raw = base64.b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise RestError(400, f"instance {i}: column {name!r}: Unable to base64 decode") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RestError(400, f"instance {i}: column {name!r}: the b64 value's bytes are not UTF-8 text") from None


def _is_b64(value):
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _json_type(value):
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


# ---- answers --------------------------------------------------------------------------------

def answer(predictions, columnar, sig, version):
    """The predict response: {"predictions": one per instance} for the row form, {"outputs": ...}
    for the columnar one (a model of several outputs: {output: [one per instance]}), with the
    version that answered (this server's addition)."""
    if hasattr(predictions, "tolist"):
        predictions = predictions.tolist()
    if not columnar:
        return {"predictions": predictions, "model_version": version}
    if len(sig.outputs) == 1:
        return {"outputs": predictions, "model_version": version}
    return {"outputs": {name: [p[name] for p in predictions] for name in sig.outputs}, "model_version": version}


# --- a large body, read in pieces -----------------------------------------------------------------
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def parse_in_pieces(body):
    """json.loads(body), the same document and the same refusals (ValueError, RecursionError), read
    one value at a time where a body's size lies: the elements of the top-level object's arrays and
    of its objects' arrays (the rows of "instances", the columns of "inputs"). json.loads holds the
    interpreter's lock for the whole body (2.4 s for 77 MB); read in pieces on a thread, the lock
    passes between them and the event loop goes on serving the other clients."""
    text = body.decode(json.detect_encoding(body), "surrogatepass") if isinstance(body, (bytes, bytearray)) else body
    i = _SPACE.match(text, 0).end()
    if not text.startswith("{", i):
        return json.loads(text)   # not an object: the caller refuses it as json.loads reads it
    document, i = _object(text, i, depth=0)
    if _SPACE.match(text, i).end() != len(text):
        raise ValueError(f"Extra data: char {i}")
    return document


def _value(text, i, depth):
    """A value of an object at `depth` (0: the body): an array's elements each read whole; the
    body's objects' values in turn."""
    if text.startswith("[", i):
        return _array(text, i)
    if depth == 0 and text.startswith("{", i):
        return _object(text, i, depth + 1)
    return _DECODER.raw_decode(text, i)


def _object(text, i, depth):
    out = {}

    def member(i):
        if not text.startswith('"', i):
            raise ValueError(f"Expecting property name enclosed in double quotes: char {i}")
        key, i = _DECODER.raw_decode(text, i)
        i = _SPACE.match(text, i).end()
        if not text.startswith(":", i):
            raise ValueError(f"Expecting ':' delimiter: char {i}")
        out[key], i = _value(text, _SPACE.match(text, i + 1).end(), depth)
        return i

    return out, _items(text, i, "}", member)


def _array(text, i):
    out = []

    def element(i):
        value, i = _DECODER.raw_decode(text, i)
        out.append(value)
        return i

    return out, _items(text, i, "]", element)


def _items(text, i, close, read):
    """Reads the comma-separated items of the object or array opened at text[i] with `read`
    (an item's start -> its end), to `close`: the index past it."""
    i = _SPACE.match(text, i + 1).end()
    if text.startswith(close, i):
        return i + 1
    while True:
        i = _SPACE.match(text, read(i)).end()
        if text.startswith(close, i):
            return i + 1
        if not text.startswith(",", i):
            raise ValueError(f"Expecting ',' delimiter: char {i}")
        i = _SPACE.match(text, i + 1).end()
