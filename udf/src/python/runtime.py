# Riverbank's side of `language: python` UDFs, loaded once into the embedded interpreter
# (udf/src/python/mod.rs). Plain Python, no third-party imports: the worker's interpreter
# may have nothing installed.
import ast
import collections.abc
import datetime
import json
import traceback

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class Row:
    """A row as Beam passes it to a callable: fields as attributes (beam.Row's behaviour)."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def _asdict(self):
        return dict(self.__dict__)

    def __iter__(self):
        return iter(self.__dict__.values())

    def __len__(self):
        return len(self.__dict__)

    def __eq__(self, other):
        return type(other) is Row and self.__dict__ == other.__dict__

    def __hash__(self):
        return hash(tuple(self.__dict__.items()))

    def __repr__(self):
        return "Row(%s)" % ", ".join("%s=%r" % kv for kv in self.__dict__.items())


class Timestamp:
    """Beam's `Timestamp` (apache_beam.utils.timestamp), what Beam passes for timestamp fields:
    microseconds since the epoch, UTC."""

    __slots__ = ("micros",)

    def __init__(self, seconds=0, micros=0):
        self.micros = int(seconds * 1000000) + int(micros)

    @staticmethod
    def of(seconds):
        return seconds if isinstance(seconds, Timestamp) else Timestamp(seconds)

    @staticmethod
    def from_utc_datetime(dt):
        return Timestamp(micros=_datetime_micros(dt))

    @staticmethod
    def from_rfc3339(s):
        return Timestamp.from_utc_datetime(datetime.datetime.fromisoformat(s.replace("Z", "+00:00")))

    def seconds(self):
        return self.micros / 1000000

    def to_utc_datetime(self, has_tz=False):
        dt = _EPOCH + datetime.timedelta(microseconds=self.micros)
        return dt if has_tz else dt.replace(tzinfo=None)

    def to_rfc3339(self):
        return self.to_utc_datetime().isoformat() + "Z"

    def __float__(self):
        return self.seconds()

    def __int__(self):
        return self.micros // 1000000

    def __repr__(self):
        return "Timestamp(%s)" % (self.micros / 1000000)

    def __str__(self):
        return self.to_rfc3339()

    def __eq__(self, other):
        return isinstance(other, Timestamp) and self.micros == other.micros

    def __lt__(self, other):
        return self.micros < Timestamp.of(other).micros

    def __le__(self, other):
        return self.micros <= Timestamp.of(other).micros

    def __gt__(self, other):
        return self.micros > Timestamp.of(other).micros

    def __ge__(self, other):
        return self.micros >= Timestamp.of(other).micros

    def __hash__(self):
        return hash(self.micros)

    def __add__(self, seconds):
        return Timestamp(micros=self.micros + int(seconds * 1000000))

    def __sub__(self, other):
        if isinstance(other, Timestamp):
            return (self.micros - other.micros) / 1000000
        return Timestamp(micros=self.micros - int(other * 1000000))


def _datetime_micros(dt):
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    d = dt - _EPOCH
    return (d.days * 86400 + d.seconds) * 1000000 + d.microseconds


def micros(v):
    """A result meant as a timestamp, in microseconds since the epoch."""
    if isinstance(v, Timestamp) or hasattr(v, "micros"):
        return int(v.micros)
    if isinstance(v, datetime.datetime):
        return _datetime_micros(v)
    if isinstance(v, datetime.date):
        return _datetime_micros(datetime.datetime(v.year, v.month, v.day))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(round(v * 1000000))
    raise TypeError("%r is not a timestamp" % (v,))


def any_value(text):
    """A value of a field typed `Any` (several types, kept as JSON text): objects as Rows."""
    return json.loads(text, object_hook=lambda d: Row(**d))


def _jsonable(v):
    if isinstance(v, Row):
        return v._asdict()
    if isinstance(v, _LISTLIKE):
        return list(v)
    if isinstance(v, (Timestamp, datetime.datetime, datetime.date)):
        return str(v)
    raise TypeError("%s %r" % (type(v).__name__, v))


def any_text(v):
    """A result typed `Any`, as the JSON text the field holds."""
    return json.dumps(_plain(v), default=_jsonable, allow_nan=False, separators=(",", ":"))


# ---------------------------------------------------------------- compiling UDFs

_GLOBALS = None


class _Beam:
    """`beam`, which Beam puts in every UDF's scope: `beam.Row` is Riverbank's Row; anything
    else comes from apache_beam itself, imported on first use (when the worker has it)."""

    def __init__(self, name):
        self.__name__ = name

    def __getattr__(self, attr):
        if attr == "Row":
            return Row
        import apache_beam

        return getattr(apache_beam, attr)


def _globals():
    """What a UDF sees besides its row: Beam's expression UDFs see `math`, `re`, `datetime`
    and the like through Python's builtins plus these imports."""
    global _GLOBALS
    if _GLOBALS is None:
        import json
        import math
        import re

        _GLOBALS = {"beam": _Beam("beam"), "math": math, "re": re, "json": json,
                    "datetime": datetime, "Row": Row, "Timestamp": Timestamp}
    return dict(_GLOBALS)


def compile_udf(kind, source, names, path, name):
    """The function a UDF runs, taking its arguments positionally: an expression's variables,
    or the row's fields (made into a Row for a callable)."""
    g = _globals()
    if kind == "expression":
        params = ", ".join(names)
        code = compile("lambda %s: (%s\n)" % (params, source), "<expression>", "eval")
        return eval(code, g)
    if kind == "callable":
        user = _load_callable(source, g)
        if not callable(user):
            raise TypeError("callable is not a function (it is %s)" % type(user).__name__)
    else:
        exec(compile(source, path, "exec"), g)
        user = g.get(name)
        if user is None:
            raise NameError("no function '%s' in %s" % (name, path))
        if not callable(user):
            raise TypeError("'%s' in %s is not a function" % (name, path))
    # The row is built by code made for its fields (a dict display, no **kwargs): this is the
    # per-record cost of every callable.
    params = ", ".join("a%d" % i for i in range(len(names)))
    items = ", ".join("%r: a%d" % (n, i) for i, n in enumerate(names))
    src = "def row_fn(%s):\n    r = _new(Row)\n    r.__dict__ = {%s}\n    return user(r)\n" % (params, items)
    scope = {"_new": object.__new__, "Row": Row, "user": user}
    exec(compile(src, "<riverbank>", "exec"), scope)
    return scope["row_fn"]


def _load_callable(source, g):
    """A callable's source as Beam loads it: a dotted name is imported (`pkg.module.fn`);
    otherwise the last top-level statement is the function (a `def` or a `class`, else an
    expression such as a lambda), after whatever precedes it."""
    name = source.strip()
    if "." in name and all(part.isidentifier() for part in name.split(".")):
        import importlib

        o, path = None, ""
        for segment in name.split("."):
            path = path + "." + segment if path else segment
            o = getattr(o, segment) if o is not None and hasattr(o, segment) else importlib.import_module(path)
        return o
    lines = [ln for ln in source.split("\n") if ln.strip() and ln.strip()[0] != "#"]
    indent = min(len(ln) - len(ln.lstrip()) for ln in lines)
    lines = [ln[indent:] for ln in lines]
    name = "__python_callable__"
    for ix, line in reversed(list(enumerate(lines))):
        if line[0] != " ":
            if line.startswith("def "):
                name = line[4:line.index("(")].strip()
            elif line.startswith("class "):
                name = line[6:line.index("(") if "(" in line else line.index(":")].strip()
            else:
                lines[ix] = name + " = " + line
            break
    exec(compile("\n".join(lines), "<callable>", "exec"), g)
    return g[name]


def row_fields(kind, source, name, fields):
    """The fields a callable reads of its row, when it only ever reads `row.<field>`: then only
    those are converted (and read from the source). None when it uses the row otherwise."""
    try:
        if kind == "callable":
            lines = [ln for ln in source.split("\n") if ln.strip() and ln.strip()[0] != "#"]
            indent = min(len(ln) - len(ln.lstrip()) for ln in lines)
            tree = ast.parse("\n".join(ln[indent:] for ln in lines))
            last = tree.body[-1]
            fn = last.value if isinstance(last, ast.Expr) else last
        else:
            tree = ast.parse(source)
            fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if not isinstance(fn, (ast.Lambda, ast.FunctionDef)) or len(fn.args.args) != 1:
            return None
    except (SyntaxError, ValueError, StopIteration):
        return None
    param = fn.args.args[0].arg
    parents = {}
    for node in ast.walk(fn):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
        if node is not fn and isinstance(node, (ast.Lambda, ast.FunctionDef)):
            if any(a.arg == param for a in node.args.args + node.args.kwonlyargs):
                return None
    used = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == param:
            parent = parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr in fields
                    and isinstance(parent.ctx, ast.Load)):
                return None
            if parent.attr not in used:
                used.append(parent.attr)
    return [f for f in fields if f in used]


_LISTLIKE = (range, set, frozenset, collections.abc.Iterator, collections.abc.KeysView,
             collections.abc.ValuesView)


def _plain(v):
    """A result as a column can hold it: what Python iterates without being a list — a range,
    a generator or other iterator, a set, a dict's keys or values — becomes a list (Beam's
    Explode takes any iterable). Tuples are taken as lists already."""
    if isinstance(v, _LISTLIKE) and not isinstance(v, (str, bytes)):
        return list(v)
    return v


def run_batch(f, columns, rows):
    """Calls `f` on each row of the argument columns (lists). Returns the results, or on an
    exception the results so far and the failure (message, traceback)."""
    out = []
    append = out.append
    try:
        if columns:
            for args in zip(*columns):
                append(_plain(f(*args)))
        else:
            for _ in range(rows):
                append(_plain(f()))
    except Exception as e:
        return out, ("%s: %s" % (type(e).__name__, e), _traceback(e))
    return out, None


def _traceback(e):
    # Riverbank's own frames (this file) are left out: the stack is the user's.
    frames = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename != __file__]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(e), e)
    return "Traceback (most recent call last):\n" + "".join(lines).rstrip()


def describe(v):
    """A result's Python type, for messages."""
    return type(v).__name__


# ---------------------------------------------------------------- translation to SQL

# Field kinds the translator knows: "int", "float", "str", "bool". A field of any other type
# makes an expression that reads it stay in Python.

class _NoSql(Exception):
    pass


def to_sql(source, kinds):
    """The SQL form of a Python expression when it means the same in SQL on rows without nulls
    or NaNs (the worker runs those rows in Python), as (sql, kind); None when it does not."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
        return _Sql(kinds).expr(tree.body)
    except (_NoSql, SyntaxError, RecursionError, ValueError):
        return None


def _q(name):
    return '"%s"' % name.replace('"', '""')


def _str_lit(s):
    return "'%s'" % s.replace("'", "''")


_NUM = ("int", "float")
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "=", ast.NotEq: "<>"}
_STR_METHODS = {"upper": "upper", "lower": "lower"}


class _Sql:
    def __init__(self, kinds):
        self.kinds = kinds

    def expr(self, n):
        m = getattr(self, "_" + type(n).__name__, None)
        if m is None:
            raise _NoSql()
        return m(n)

    def _Constant(self, n):
        v = n.value
        if isinstance(v, bool):
            return ("TRUE" if v else "FALSE"), "bool"
        if isinstance(v, int):
            if abs(v) >= 2 ** 63:
                raise _NoSql()
            return "CAST(%d AS BIGINT)" % v, "int"
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise _NoSql()
            return "CAST(%r AS DOUBLE)" % v, "float"
        if isinstance(v, str):
            return _str_lit(v), "str"
        raise _NoSql()

    def _Name(self, n):
        k = self.kinds.get(n.id)
        if k is None:
            raise _NoSql()
        # Python's ints and floats are 64-bit wide: so are the SQL forms.
        if k == "int":
            return "CAST(%s AS BIGINT)" % _q(n.id), k
        if k == "float":
            return "CAST(%s AS DOUBLE)" % _q(n.id), k
        return _q(n.id), k

    def _UnaryOp(self, n):
        s, k = self.expr(n.operand)
        if isinstance(n.op, ast.Not) and k == "bool":
            return "(NOT %s)" % s, "bool"
        if isinstance(n.op, ast.USub) and k in _NUM:
            return "(- %s)" % s, k
        if isinstance(n.op, ast.UAdd) and k in _NUM:
            return s, k
        raise _NoSql()

    def _BinOp(self, n):
        (a, ka), (b, kb) = self.expr(n.left), self.expr(n.right)
        op = type(n.op)
        if ka in _NUM and kb in _NUM:
            k = "float" if "float" in (ka, kb) else "int"
            if op in (ast.Add, ast.Sub, ast.Mult):
                sym = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}[op]
                return "(%s %s %s)" % (a, sym, b), k
            # Division only by a literal that is not zero: Python raises on zero, SQL does not.
            d = _literal_number(n.right)
            if op is ast.Div and d:
                return "(CAST(%s AS DOUBLE) / CAST(%s AS DOUBLE))" % (a, b), "float"
            if op is ast.Mod and k == "int" and d is not None and d > 0:
                # Python's modulo takes the divisor's sign.
                return "(((%s %% %s) + %s) %% %s)" % (a, b, b, b), "int"
            raise _NoSql()
        if op is ast.Add and ka == kb == "str":
            return "(%s || %s)" % (a, b), "str"
        raise _NoSql()

    def _BoolOp(self, n):
        # `and`/`or` return an operand in Python: the same as SQL's only for booleans.
        parts = [self.expr(v) for v in n.values]
        if any(k != "bool" for _, k in parts):
            raise _NoSql()
        sym = " AND " if isinstance(n.op, ast.And) else " OR "
        return "(%s)" % sym.join(s for s, _ in parts), "bool"

    def _Compare(self, n):
        left = self.expr(n.left)
        terms = []
        for op, right in zip(n.ops, n.comparators):
            if type(op) in (ast.In, ast.NotIn):
                if not isinstance(right, (ast.Tuple, ast.List, ast.Set)) or not right.elts:
                    raise _NoSql()
                items = [self.expr(e) for e in right.elts]
                if not all(_comparable(left[1], k) for _, k in items):
                    raise _NoSql()
                neg = "NOT " if isinstance(op, ast.NotIn) else ""
                terms.append("(%s %sIN (%s))" % (left[0], neg, ", ".join(s for s, _ in items)))
                left = None
                if len(n.ops) > 1:
                    raise _NoSql()
                continue
            if type(op) in (ast.Is, ast.IsNot):
                if not (isinstance(right, ast.Constant) and right.value is None):
                    raise _NoSql()
                terms.append("(%s IS %sNULL)" % (left[0], "NOT " if isinstance(op, ast.IsNot) else ""))
                if len(n.ops) > 1:
                    raise _NoSql()
                continue
            r = self.expr(right)
            if not _comparable(left[1], r[1]):
                raise _NoSql()
            if left[1] == "bool" and type(op) not in (ast.Eq, ast.NotEq):
                raise _NoSql()
            terms.append("(%s %s %s)" % (left[0], _CMP[type(op)], r[0]))
            left = r
        return ("(%s)" % " AND ".join(terms) if len(terms) > 1 else terms[0]), "bool"

    def _IfExp(self, n):
        c, kc = self.expr(n.test)
        (a, ka), (b, kb) = self.expr(n.body), self.expr(n.orelse)
        if kc != "bool":
            raise _NoSql()
        if ka == kb:
            k = ka
        elif ka in _NUM and kb in _NUM:
            # Python keeps each branch's type; a column has one: stay in Python.
            raise _NoSql()
        else:
            raise _NoSql()
        return "(CASE WHEN %s THEN %s ELSE %s END)" % (c, a, b), k

    def _Call(self, n):
        if n.keywords:
            raise _NoSql()
        f = n.func
        if isinstance(f, ast.Name) and len(n.args) == 1:
            s, k = self.expr(n.args[0])
            if f.id == "len" and k == "str":
                return "CAST(character_length(%s) AS BIGINT)" % s, "int"
            if f.id == "float" and k in _NUM:
                return "CAST(%s AS DOUBLE)" % s, "float"
            if f.id == "int" and k == "int":
                return s, "int"
            if f.id == "str" and k in ("str", "int"):
                return "CAST(%s AS VARCHAR)" % s, "str"
            if f.id == "abs" and k in _NUM:
                return "abs(%s)" % s, k
            if f.id == "bool" and k == "bool":
                return s, k
            raise _NoSql()
        if isinstance(f, ast.Attribute):
            s, k = self.expr(f.value)
            if k != "str":
                raise _NoSql()
            args = [self.expr(a) for a in n.args]
            if any(ka != "str" for _, ka in args):
                raise _NoSql()
            if f.attr in _STR_METHODS and not args:
                return "%s(%s)" % (_STR_METHODS[f.attr], s), "str"
            if f.attr in ("startswith", "endswith") and len(args) == 1:
                fn = "starts_with" if f.attr == "startswith" else "ends_with"
                return "%s(%s, %s)" % (fn, s, args[0][0]), "bool"
            if f.attr == "replace" and len(args) == 2 and _literal_str(n.args[0]):
                return "replace(%s, %s, %s)" % (s, args[0][0], args[1][0]), "str"
        raise _NoSql()


def _literal_number(n):
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        v = _literal_number(n.operand)
        return None if v is None else -v
    if isinstance(n, ast.Constant) and type(n.value) in (int, float):
        return n.value
    return None


def _literal_str(n):
    return isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value != ""


def _comparable(a, b):
    return a == b or (a in _NUM and b in _NUM)


# ---------------------------------------------------------------- dependencies

def add_site_dirs(dirs):
    """Puts a job's venv site-packages first on sys.path (with its .pth files), once each."""
    import site
    import sys

    for d in reversed(dirs):
        if d in sys.path:
            continue
        before = list(sys.path)
        site.addsitedir(d)
        added = [p for p in sys.path if p not in before]
        sys.path[:] = added + [p for p in sys.path if p not in added]


# ---------------------------------------------------------------- custom CombineFns

_COMBINE_METHODS = ("create_accumulator", "add_input", "merge_accumulators", "extract_output")


class _CallableCombineFn:
    """A plain callable as a CombineFn, as Beam wraps one (CallableWrapperCombineFn): it is
    given all of a key's values at once."""

    def __init__(self, fn):
        self._fn = fn

    def create_accumulator(self):
        return []

    def add_input(self, acc, v):
        acc.append(v)
        return acc

    def merge_accumulators(self, accs):
        out = []
        for a in accs:
            out.extend(a)
        return out

    def extract_output(self, acc):
        return self._fn(acc)


def combine_fn(source, config_json):
    """A combine `fn` as Beam YAML loads it with language: python: a dotted name is imported,
    other source defines it; `config` are keyword arguments to construct it with."""
    import json

    fn = _load_callable(source, _globals())
    if config_json is not None:
        fn = fn(**json.loads(config_json))
    if all(hasattr(fn, m) for m in _COMBINE_METHODS):
        if hasattr(fn, "setup"):
            fn.setup()
        return fn
    if callable(fn):
        return _CallableCombineFn(fn)
    raise TypeError("%s is not a CombineFn (it has no %s)" % (type(fn).__name__, ", ".join(
        m for m in _COMBINE_METHODS if not hasattr(fn, m))))


def _grow(fn, accs, n):
    while len(accs) < n:
        accs.append(fn.create_accumulator())


def combine_add(fn, accs, groups, values, n):
    """Adds each value to its group's accumulator (accs grows to n groups)."""
    _grow(fn, accs, n)
    add = fn.add_input
    for g, v in zip(groups, values):
        accs[g] = add(accs[g], v)


def combine_merge(fn, accs, groups, states, n):
    """Merges pickled partial accumulators into their groups' accumulators."""
    import pickle

    _grow(fn, accs, n)
    merge = fn.merge_accumulators
    for g, s in zip(groups, states):
        accs[g] = merge([accs[g], pickle.loads(s)])


def combine_take(accs, n):
    """The first n accumulators, removed (DataFusion's EmitTo)."""
    out = accs[:n]
    del accs[:n]
    return out


def _dumps(a):
    """An accumulator's bytes: pickle, or cloudpickle (by value, as Beam does) for what pickle
    cannot name, such as an instance of a class defined in the pipeline's source."""
    import pickle

    try:
        return pickle.dumps(a, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        try:
            import cloudpickle
        except ImportError:
            raise TypeError("the accumulator %s cannot be pickled (%s); install cloudpickle "
                            "(dependencies: [cloudpickle]) or use picklable accumulators"
                            % (type(a).__name__, e)) from None
        return cloudpickle.dumps(a)


def combine_state(accs, n):
    return [_dumps(a) for a in combine_take(accs, n)]


def combine_extract(fn, accs, n):
    return [fn.extract_output(a) for a in combine_take(accs, n)]


def combine_sample(fn, values):
    """The output on sample values, for the output type."""
    acc = fn.create_accumulator()
    for v in values:
        acc = fn.add_input(acc, v)
    return fn.extract_output(fn.merge_accumulators([acc, fn.create_accumulator()]))
