"""Python map functions: the graph's `type: python` nodes, served by one thread of this process each.

    def caption_length(sample):          # a dict: field name -> value, plus "__key__" and "__url__"
        out = dict(sample)
        out["len"] = np.int64(len(sample["txt"]))
        return out                       # or None: the sample is dropped (counted as skipped)

    shardflow.Pipeline("graph.yaml", map={"lengths": caption_length})   # node `name: lengths`, type: python

What fn receives: decoded fields as read-only NumPy arrays that are zero-copy views of the engine's
buffers, valid only during the call (keep one with .copy()); bfloat16 fields come as uint16 bits;
encoded fields (the shard's bytes) as `bytes` (a copy). What it returns: a dict whose fields become
the new sample: a value that is one of the arrays it was given passes on without a copy (renamed if
its name changed); other arrays are copied into new tensors (uint8, int32, int64 or float32; other
dtypes are an error: cast first); bytes become encoded fields; "__key__" sets the key. An exception
is an error record with the sample's key, the exception's type and message (the graph's
error_policy: skip drops the sample and goes on, fail stops the pipeline). SystemExit, KeyboardInterrupt
and GeneratorExit (BaseExceptions that are not Exceptions: requests to stop, not bad samples) stop the
pipeline whatever the error_policy, and fn is not called again; the trainer's next_batch() raises the
first two as themselves (sys.exit(7) in fn exits the trainer with 7), the others as ShardflowError
(code SF_ECANCELED) caused by them.

Threading: the node's stage (stages/python.c) never calls Python. It hands samples over a bounded
handoff (include/shardflow/handoff.h) to this module's thread, which waits in C without the GIL and
calls fn with it; the engine's pool threads never take the GIL, so the rest of the graph keeps
running while fn works or sleeps.
"""
import ctypes
import importlib
import threading
import traceback

import numpy as np

from . import SF_EOF, library

SF_EINVAL, SF_ECANCELED = -4, -16  # include/shardflow/error.h
_PASS, _DROP = 0, 1  # SF_HANDOFF_PASS, SF_HANDOFF_DROP
_MAX_DIMS = 6
# sf_dtype (include/shardflow/tensor.h) <-> NumPy; bfloat16 has no NumPy dtype: its bits as uint16.
_DTYPES = {0: np.uint8, 1: np.int32, 2: np.int64, 3: np.float32, 4: np.uint16, 6: np.float64}
_CODES = {np.dtype(np.uint8): 0, np.dtype(np.int32): 1, np.dtype(np.int64): 2, np.dtype(np.float32): 3}


class _Tensor(ctypes.Structure):  # sf_tensor (include/shardflow/tensor.h)
    _fields_ = [("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * _MAX_DIMS),
                ("strides", ctypes.c_int64 * _MAX_DIMS), ("offset", ctypes.c_size_t), ("buffer", ctypes.c_void_p)]


class _Field(ctypes.Structure):  # sf_field (include/shardflow/sample.h)
    _fields_ = [("name", ctypes.c_char * 32), ("encoded", ctypes.c_bool), ("tensor", _Tensor),
                ("recipe", ctypes.c_void_p)]


def _declare():
    p, c, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    sigs = {
        "sf_handoff_new": (i, [ctypes.POINTER(p), i]),
        "sf_graph_attach": (i, [p, c, p]),
        "sf_handoff_unref": (None, [ctypes.POINTER(p)]),
        "sf_handoff_close": (None, [p]),
        "sf_handoff_take": (i, [p, ctypes.POINTER(p), ctypes.c_double]),
        "sf_handoff_finish": (None, [p, ctypes.POINTER(p), i, c]),
        "sf_sample_key": (c, [p]),
        "sf_sample_url": (c, [p]),
        "sf_sample_field_count": (i, [p]),
        "sf_sample_field_at": (ctypes.POINTER(_Field), [p, i]),
        "sf_sample_derive": (p, [p]),
        "sf_sample_set_key": (i, [p, c, ctypes.c_size_t]),
        "sf_sample_add_field_copy": (i, [p, c, ctypes.c_bool, i, i, ctypes.POINTER(ctypes.c_int64), p]),
        "sf_sample_add_field_ref": (i, [p, c, p, i]),
        "sf_sample_destroy": (None, [ctypes.POINTER(p)]),
        "sf_buffer_data": (p, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(library, name)
        fn.restype, fn.argtypes = res, args


_declare()


def _view(t):
    """A read-only NumPy view of tensor t (no copy), valid while its sample is."""
    dtype = np.dtype(_DTYPES[t.dtype])
    shape = tuple(t.shape[k] for k in range(t.ndim))
    strides = tuple(t.strides[k] * dtype.itemsize for k in range(t.ndim))
    if 0 in shape:
        return np.empty(shape, dtype)
    span = dtype.itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, t.strides[:t.ndim])))
    raw = (ctypes.c_uint8 * span).from_address(library.sf_buffer_data(t.buffer) + t.offset)
    a = np.ndarray(shape, dtype, buffer=raw, strides=strides)
    a.flags.writeable = False
    return a


def _sample_dict(sample):
    """fn's argument, and {id(view): field index} to recognise views it returns unchanged."""
    d, given = {"__key__": library.sf_sample_key(sample).decode(errors="replace"),
                "__url__": library.sf_sample_url(sample).decode(errors="replace")}, {}
    for i in range(library.sf_sample_field_count(sample)):
        f = library.sf_sample_field_at(sample, i)
        if not f:
            raise MemoryError("out of memory writing a deferred field")
        f = f.contents
        t = f.tensor
        if f.encoded:
            value = ctypes.string_at(library.sf_buffer_data(t.buffer) + t.offset, t.shape[0] if t.ndim else 1)
        else:
            value = _view(t)
            given[id(value)] = i
        d[f.name.decode()] = value
    return d, given


def _check(r, what):
    if r < 0:
        raise ValueError(f"{what}: {library.sf_strerror(r).decode()}")


def _build(sample, out, given):
    """The result sample for fn's dict out (a new sf_sample*, caller owns it)."""
    if not isinstance(out, dict):
        raise TypeError(f"the map function returned {type(out).__name__}: return a dict of fields, or None to drop")
    res = ctypes.c_void_p(library.sf_sample_derive(sample))
    if not res:
        raise MemoryError("out of memory")
    try:
        for name, value in out.items():
            if name == "__key__":
                key = str(value).encode()
                _check(library.sf_sample_set_key(res, key, len(key)), "__key__")
                continue
            if name.startswith("__"):
                continue
            bname = name.encode()
            if id(value) in given:
                _check(library.sf_sample_add_field_ref(res, bname, sample, given[id(value)]), f"field {name!r}")
            elif isinstance(value, (bytes, bytearray, memoryview)):
                data = bytes(value)
                shape = (ctypes.c_int64 * 1)(len(data))
                _check(library.sf_sample_add_field_copy(res, bname, True, 0, 1, shape, data), f"field {name!r}")
            else:
                a = np.ascontiguousarray(value)
                if a.dtype not in _CODES:
                    raise TypeError(f"field {name!r} is {a.dtype}: shardflow tensors are uint8, int32, int64 or "
                                    f"float32; cast it (e.g. .astype(np.float32))")
                if a.ndim > _MAX_DIMS:
                    raise ValueError(f"field {name!r} has {a.ndim} dimensions; at most {_MAX_DIMS}")
                shape = (ctypes.c_int64 * max(1, a.ndim))(*a.shape)
                _check(library.sf_sample_add_field_copy(res, bname, False, _CODES[a.dtype], a.ndim, shape,
                                                        a.ctypes.data), f"field {name!r}")
        return res
    except BaseException:
        library.sf_sample_destroy(ctypes.byref(res))
        raise


def _serve(handoff, fn, label, stopped):
    """The node's thread: waits for a sample in C (without the GIL), calls fn, hands the result back.
    stopped: a list that receives the BaseException (not an Exception) that stopped it, for raised()."""
    sample, stop_message = ctypes.c_void_p(), None
    while library.sf_handoff_take(handoff, ctypes.byref(sample), -1.0) != SF_EOF:
        res, status, message = ctypes.c_void_p(), _PASS, None
        if stopped:  # fn asked to stop: the pipeline fails on the sample before this one; no more calls
            library.sf_handoff_finish(handoff, ctypes.byref(res), SF_ECANCELED, stop_message)
            continue
        try:
            arg, given = _sample_dict(sample)
            out = fn(arg)
            if out is None:
                status = _DROP
            else:
                res = _build(sample, out, given)
        except Exception as e:  # noqa: BLE001 - every exception of the user's function becomes a record
            status = SF_EINVAL
            message = f"python map {label} raised {type(e).__name__}: {e}".encode(errors="replace")
        except BaseException as e:  # SystemExit, KeyboardInterrupt, GeneratorExit: the trainer's thread raises it
            traceback.clear_frames(e.__traceback__)  # its frames' views of the sample die with the sample
            stopped.append(e)
            status = SF_ECANCELED
            text = f"python map {label} raised {type(e).__name__}{': ' + str(e) if str(e) else ''}; the pipeline stopped"
            message = stop_message = text.encode(errors="replace")
        arg = given = out = None  # the views die with the sample
        library.sf_handoff_finish(handoff, ctypes.byref(res), status, message)


def _resolve(spec, node):
    """"pkg.module:fn" -> the callable."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"node {node!r}: function {spec!r} is not \"pkg.module:fn\"")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"node {node!r}: cannot load function {spec!r} ({type(e).__name__}: {e}); "
                         f"check the module is on sys.path") from e
    if not callable(obj):
        raise ValueError(f"node {node!r}: {spec!r} is not callable")
    return obj


def start(g, maps):
    """Starts a thread and a handoff for every `type: python` node of graph g (attached to the node).
    maps: {node name: callable}. Returns what stop() takes. Raises ValueError (a map= name that is no
    python node, a node without a function or whose function does not import). A python node inside
    a group is refused when the graph loads (engine/graph/graph_groups.c)."""
    names = [library.sf_graph_node_name(g, i).decode() for i in range(library.sf_graph_node_count(g))]
    types = [library.sf_graph_node_type(g, i).decode() for i in range(len(names))]
    for name in maps:
        if name not in names:
            raise ValueError(f"map={{{name!r}: ...}}: the graph has no node {name!r} (nodes: {', '.join(names)})")
        if types[names.index(name)] != "python":
            raise ValueError(f"map={{{name!r}: ...}}: node {name!r} is a {types[names.index(name)]} stage; "
                             f"map functions serve `type: python` nodes")
    started = []
    try:
        for i, (name, stype) in enumerate(zip(names, types)):
            if stype != "python":
                continue
            spec = library.sf_graph_node_option(g, i, b"function").decode()
            fn = maps.get(name) or (_resolve(spec, name) if spec else None)
            if fn is None:
                raise ValueError(f"node {name!r} (type: python) has no function: set function: \"pkg.module:fn\" "
                                 f"or pass Pipeline(map={{{name!r}: fn}})")
            handoff = ctypes.c_void_p()
            r = library.sf_handoff_new(ctypes.byref(handoff),
                                       int(library.sf_graph_node_option(g, i, b"in_flight").decode()))
            _check(r, f"node {name!r}")
            stopped = []
            thread = threading.Thread(target=_serve, name=f"shardflow-map-{name}", daemon=True,
                                      args=(handoff, fn, spec or getattr(fn, "__qualname__", repr(fn)), stopped))
            started.append((handoff, thread, stopped))
            _check(library.sf_graph_attach(g, name.encode(), handoff), f"node {name!r}")
            thread.start()
    except BaseException:
        stop(started)
        raise
    return started


def raised(started):
    """The first SystemExit, KeyboardInterrupt or other non-Exception a map function raised, or None;
    each is returned once (the trainer raises it once; later calls raise the pipeline's error record)."""
    for _, _, stopped in started:
        if stopped and stopped[0] is not None:
            e, stopped[0] = stopped[0], None  # stays non-empty: _serve calls fn no more
            return e
    return None


def stop(started):
    """Closes the handoffs (the threads return after fn's current call) and frees them."""
    for handoff, _, _ in started:
        library.sf_handoff_close(handoff)
    for handoff, thread, _ in started:
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join()
        library.sf_handoff_unref(ctypes.byref(handoff))
