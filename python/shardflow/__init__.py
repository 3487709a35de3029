"""shardflow for Python: run a graph file, get batches as NumPy arrays or PyTorch tensors without a copy.

    import shardflow
    for images, labels in shardflow.Pipeline("graphs/cifar10_train.yaml", batch_size=256):
        ...                      # images: float32 [B,3,32,32], labels: int64 [B]

The binding is ctypes over libshardflow (no compiler needed); batches reach NumPy and
PyTorch through DLPack, so `numpy.from_dlpack` / `torch.from_dlpack` see the engine's own
buffer. Keyword arguments set stage options by name (`batch_size=256`) or, where several
stages have that option, as NODE__OPTION (`shard_source__urls=...`); the stages' option
tables decide what exists (`shardflow help STAGE`).
"""
import atexit
import ctypes
import ctypes.util
import functools
import logging
import os
import threading
import time

from . import elastic
from .elastic import merge_states

__all__ = ["ClosedError", "Dataset", "Pipeline", "ShardflowError", "copy", "dataset", "get_include", "get_plugin_dir", "library",
           "merge_states"]

SF_EAGAIN, SF_EOF, SF_ETIMEDOUT, SF_ECANCELED = -1, -2, -12, -16  # include/shardflow/error.h
_WAIT_SLICE = 0.1  # seconds next_batch() waits in C between chances for Python to run signal handlers


_HERE = os.path.dirname(os.path.abspath(__file__))


def get_include():
    """The directory that holds shardflow/stage.h and the other public headers: `-I` for a plugin's or an
    embedding program's build (numpy.get_include()'s convention; `shardflow config --cflags` says the same).
    A pip install ships them in the package (shardflow/include); the package of a source tree
    (PYTHONPATH=python) answers with the tree's include/."""
    for d in (os.path.join(_HERE, "include"), os.path.join(_HERE, os.pardir, os.pardir, "include")):
        if os.path.isfile(os.path.join(d, "shardflow", "stage.h")):
            return os.path.normpath(d)
    return os.path.join(_HERE, "include")


def get_plugin_dir():
    """The directory of a pip install's plugins (shardflow/plugins, beside its libshardflow.so), which
    `plugins: [NAME]` searches after SHARDFLOW_PLUGIN_PATH: put NAME.so there to load it by name
    (`shardflow config --plugin-dir` says the same). None when this package runs a library from elsewhere
    (SHARDFLOW_LIB, a build tree): that installation's `shardflow config --plugin-dir` names its own."""
    if os.path.realpath(library._name) != os.path.realpath(os.path.join(_HERE, "libshardflow.so")):
        return None
    return os.path.join(_HERE, "plugins")


class ShardflowError(RuntimeError):
    """An error record from the engine: code name, and the message with file:line or URL and offset."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class ClosedError(ShardflowError):
    """A Pipeline used after close() (also a close() from another thread while this one waited in
    next_batch()): "pipeline 'graphs/x.yaml' is closed", code SF_ECANCELED. A ShardflowError."""


class _Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("stage", ctypes.c_char * 32), ("url", ctypes.c_char * 512),
                ("key", ctypes.c_char * 128), ("offset", ctypes.c_int64), ("line", ctypes.c_int64),
                ("message", ctypes.c_char * 512)]


class _Options(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("world_size", ctypes.c_int), ("epochs", ctypes.c_int64),
                ("first_epoch", ctypes.c_uint64), ("first_step", ctypes.c_uint64)]


class _StageTuned(ctypes.Structure):
    """sf_stage_tuned (include/shardflow/stage.h)."""
    _fields_ = [("option", ctypes.c_char_p), ("value", ctypes.c_int64), ("initial", ctypes.c_int64),
                ("pinned", ctypes.c_bool), ("changes", ctypes.c_uint64), ("changed_at", ctypes.c_double)]


class _StageStats(ctypes.Structure):
    """sf_stage_stats (include/shardflow/stage.h)."""
    _fields_ = [("reads", ctypes.c_bool), ("read_ns", ctypes.c_uint64), ("reader", ctypes.c_bool)] + \
        [(name, ctypes.c_uint64) for name in ("downloaded_bytes", "refetched_bytes", "retries", "cache_hits",
                                              "prefetch")] + [("group", ctypes.c_bool)] + \
        [(name, ctypes.c_uint64) for name in ("workers", "reassigned", "duplicates", "malformed", "refused",
                                              "ring_bytes", "socket_bytes")] + \
        [("n_tuned", ctypes.c_int), ("tuned", _StageTuned * 4)]


class _NodeStats(ctypes.Structure):
    """sf_node_stats (include/shardflow/shardflow.h)."""
    _fields_ = [("name", ctypes.c_char * 32), ("type", ctypes.c_char * 32), ("replicas", ctypes.c_int),
                ("items", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("busy_seconds", ctypes.c_double),
                ("wait_seconds", ctypes.c_double), ("errors", ctypes.c_uint64), ("skipped", ctypes.c_uint64),
                ("filtered", ctypes.c_uint64), ("n_inputs", ctypes.c_int), ("input_names", (ctypes.c_char * 32) * 64),
                ("input_items", ctypes.c_uint64 * 64), ("n_counters", ctypes.c_int),
                ("counter_names", (ctypes.c_char * 32) * 4), ("counters", ctypes.c_uint64 * 4),
                ("stage", _StageStats)]


class _WorkerStageStats(ctypes.Structure):
    """sf_worker_stage_stats (include/shardflow/stage.h)."""
    _fields_ = [("name", ctypes.c_char * 32), ("items", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("busy_seconds", ctypes.c_double), ("wait_seconds", ctypes.c_double), ("errors", ctypes.c_uint64)]


class _WorkerStats(ctypes.Structure):
    """sf_worker_stats (include/shardflow/stage.h)."""
    _fields_ = [("name", ctypes.c_char * 64), ("pid", ctypes.c_int64), ("live", ctypes.c_bool),
                ("samples", ctypes.c_uint64), ("units", ctypes.c_uint64), ("rate", ctypes.c_double),
                ("n_stages", ctypes.c_int), ("stages", _WorkerStageStats * 64)]


# sf_log_handler (include/shardflow/log.h): opaque, level, stage (NULL for the engine), message.
_LogHandler = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


def _find_library():
    """libshardflow.so: beside the package (a pip install), else SHARDFLOW_LIB, else the source
    tree's build/, else the system's library path."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libshardflow.so"), os.environ.get("SHARDFLOW_LIB"),
                  os.path.join(here, "..", "..", "build", "libshardflow.so")]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    found = ctypes.util.find_library("shardflow")
    if not found:
        raise OSError("libshardflow not found: install the package (pip install --no-build-isolation .) "
                      "or build it (meson) and set SHARDFLOW_LIB to libshardflow.so")
    return found


def _load():
    # RTLD_GLOBAL: plugins a graph names (plugins:) call the library's SF_API functions.
    lib = ctypes.CDLL(_find_library(), mode=ctypes.RTLD_GLOBAL)
    p, c = ctypes.c_void_p, ctypes.c_char_p
    sigs = {
        "sf_strerror": (c, [ctypes.c_int]),
        "sf_err_name": (c, [ctypes.c_int]),
        "sf_error_format": (c, [ctypes.POINTER(_Error), ctypes.c_char_p, ctypes.c_uint]),
        "sf_graph_load_file": (ctypes.c_int, [ctypes.POINTER(p), c, ctypes.POINTER(_Error)]),
        "sf_graph_load_string": (ctypes.c_int, [ctypes.POINTER(p), c, c, ctypes.POINTER(_Error)]),
        "sf_graph_set": (ctypes.c_int, [p, c, c, ctypes.POINTER(_Error)]),
        "sf_graph_node_count": (ctypes.c_int, [p]),
        "sf_graph_node_name": (c, [p, ctypes.c_int]),
        "sf_graph_node_has_option": (ctypes.c_bool, [p, ctypes.c_int, c]),
        "sf_graph_node_option": (c, [p, ctypes.c_int, c]),
        "sf_graph_node_type": (c, [p, ctypes.c_int]),
        "sf_stage_help": (ctypes.c_int, [c, ctypes.c_char_p, ctypes.c_size_t]),
        "sf_graph_destroy": (None, [ctypes.POINTER(p)]),
        "sf_graph_order_fingerprint": (ctypes.c_int, [p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_Error)]),
        "sf_graph_dataset_size": (ctypes.c_int, [p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_Error)]),
        "sf_graph_mix_positions": (ctypes.c_int, [p, ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                                                  ctypes.POINTER(_Error)]),
        "sf_pipeline_options_init": (None, [ctypes.POINTER(_Options)]),
        "sf_pipeline_new": (ctypes.c_int, [ctypes.POINTER(p), p, ctypes.POINTER(_Options), ctypes.POINTER(_Error)]),
        "sf_pipeline_next": (ctypes.c_int, [p, ctypes.POINTER(p), ctypes.c_double]),
        "sf_pipeline_epoch": (ctypes.c_uint64, [p]),
        "sf_pipeline_step": (ctypes.c_uint64, [p]),
        "sf_pipeline_rank": (ctypes.c_int, [p]),
        "sf_pipeline_world_size": (ctypes.c_int, [p]),
        "sf_pipeline_order_fingerprint": (c, [p]),
        "sf_pipeline_fd": (ctypes.c_int, [p]),
        "sf_pipeline_stats": (ctypes.c_int, [p, ctypes.POINTER(_NodeStats), ctypes.c_int]),
        "sf_node_stats_size": (ctypes.c_size_t, []),
        "sf_pipeline_workers": (ctypes.c_int, [p, c, ctypes.POINTER(_WorkerStats), ctypes.c_int]),
        "sf_pipeline_last_error": (ctypes.c_bool, [p, ctypes.POINTER(_Error)]),
        "sf_pipeline_bottleneck": (ctypes.c_int, [p, ctypes.c_char_p, ctypes.c_size_t]),
        "sf_pipeline_metrics_port": (ctypes.c_int, [p]),
        "sf_pipeline_destroy": (None, [ctypes.POINTER(p)]),
        "sf_pipeline_stop": (None, [p]),
        "sf_pipeline_failed": (ctypes.c_int, [p]),
        "sf_batch_size": (ctypes.c_int64, [p]),
        "sf_batch_epoch": (ctypes.c_uint64, [p]),
        "sf_batch_field_count": (ctypes.c_int, [p]),
        "sf_batch_field_name": (c, [p, ctypes.c_int]),
        "sf_batch_key": (c, [p, ctypes.c_int64]),
        "sf_batch_origin": (ctypes.c_int, [p, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.POINTER(ctypes.c_uint64)]),
        "sf_batch_to_dlpack": (ctypes.c_int, [p, ctypes.c_int, ctypes.POINTER(p)]),
        "sf_batch_destroy": (None, [ctypes.POINTER(p)]),
        "sf_dlpack_release": (None, [p]),
        "sf_dlpack_wait": (ctypes.c_int, [p, ctypes.c_int64]),
        "sf_version_string": (c, []),
        "sf_storage_copy": (ctypes.c_int, [c, c, ctypes.c_bool, ctypes.POINTER(_Error)]),
        "sf_log_set_handler": (ctypes.c_int, [_LogHandler, p]),
        "sf_pipeline_stats": (ctypes.c_int, [p, p, ctypes.c_int]),
        "sf_pipeline_error_count": (ctypes.c_uint64, [p]),
        "sf_pipeline_skipped": (ctypes.c_uint64, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    if lib.sf_node_stats_size() != ctypes.sizeof(_NodeStats):
        raise ImportError(f"{lib._name}: sf_node_stats is {lib.sf_node_stats_size()} bytes, this package's mirror "
                          f"{ctypes.sizeof(_NodeStats)}: the library and the package come from different builds")
    return lib


library = _load()
__version__ = library.sf_version_string().decode()

# The engine's log records go to the "shardflow" logger instead of stderr, with the node's name as
# the record's `stage` attribute (None for the engine itself).
logger = logging.getLogger("shardflow")
_LOG_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}  # SF_LOG_ERROR, _WARNING, _INFO


@_LogHandler
def _log_record(opaque, level, stage, message):
    # Runs on engine threads: ctypes takes the GIL for the call.
    stage = stage.decode(errors="replace") if stage else None
    text = message.decode(errors="replace")
    if stage:
        logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s: %s", stage, text, extra={"stage": stage})
    else:
        logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text, extra={"stage": None})


library.sf_log_set_handler(_log_record, None)
# Before the interpreter goes away, engine threads of pipelines still running must stop calling into
# it: the uninstall (a ctypes call, made without the GIL) returns once calls in flight are done, and
# later records go to stderr.
atexit.register(library.sf_log_set_handler, _LogHandler(), None)  # a NULL handler: the default

# DLPack capsules (the protocol NumPy and PyTorch speak): named "dltensor" until a consumer takes
# the tensor (and with it the duty to call its deleter). The capsule has no destructor of its own:
# a Python callback there could run during interpreter shutdown, where ctypes callbacks may hang.
# A capsule that no consumer takes therefore keeps its batch buffer; from_dlpack always takes it.
_CAPSULE_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _DLTensorHead(ctypes.Structure):
    """The start of DLManagedTensor's dl_tensor (DLPack): the data pointer and the device."""
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


_KDLCPU, _KDLCUDA = 1, 2


class _Field:
    """One batch field as a DLPack producer (the __dlpack__ protocol, both call forms). A field on a GPU
    (device_sink's device: cuda) follows the protocol's stream contract: the consumer's stream (the
    stream argument; None = the legacy default stream, -1 = no ordering) waits for the batch's copy."""

    def __init__(self, managed):
        self._managed = managed
        head = _DLTensorHead.from_address(managed)
        self._device = (head.device_type, head.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if self._managed is None:
            raise BufferError("a shardflow field can be exported once")
        if copy:
            raise BufferError("a shardflow field is exported without a copy (copy=True is not offered)")
        if dl_device is not None and tuple(dl_device) != self._device:
            raise BufferError(f"the field is on DLPack device {self._device}, not {tuple(dl_device)}")
        if self._device[0] == _KDLCUDA:
            r = library.sf_dlpack_wait(self._managed, 1 if stream is None else int(stream))
            if r < 0:
                raise BufferError(f"the consumer's stream {stream!r} cannot wait for the batch's copy "
                                  f"({library.sf_err_name(r).decode()}; the engine's log says why)")
        managed, self._managed = self._managed, None
        return _capsule_new(managed, _CAPSULE_NAME, None)

    def __dlpack_device__(self):
        return self._device  # (kDLCPU, 0), or (kDLCUDA, N) for device_sink's device: cuda:N

    def __del__(self):
        if self._managed is not None:
            library.sf_dlpack_release(self._managed)


def _error(code, err=None):
    text = ctypes.create_string_buffer(2048)
    message = library.sf_error_format(ctypes.byref(err), text, len(text)).decode() if err else ""
    return ShardflowError(library.sf_err_name(code).decode(), message or library.sf_strerror(code).decode())


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def copy(src, dst, verify=True):
    """Copies a file between a local path and an http(s) URL (checkpoints to the shards' store),
    atomically: PUT + WebDAV MOVE for uploads (read back and compared unless verify=False),
    GET into a temporary file + rename for downloads. Raises ShardflowError."""
    err = _Error()
    r = library.sf_storage_copy(str(src).encode(), str(dst).encode(), verify, ctypes.byref(err))
    if r < 0:
        raise _error(r, err)


# Pipeline's output forms (see its docstring).
_OUTPUTS = ("torch", "numpy", "dict", "torch_dict", "tuple", "torch_tuple", "dlpack")


def _uses_pipeline(method):
    """Runs method with the C pipeline held: close() in another thread wakes a next() waiting here
    (sf_pipeline_stop) and frees the pipeline only once every such call has returned. On a closed
    pipeline raises ClosedError instead of calling C with a freed pointer."""
    @functools.wraps(method)
    def held(self, *args, **kwargs):
        with self._cond:
            if not self._pipeline or self._releasing:  # a call starting once _release began would starve it
                raise self._closed_error()
            self._users += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()
    return held


def _restarts(method):
    """Runs method (which replaces the C pipeline) under the pipeline's lifecycle lock, so that a
    close() in another thread comes before or after it, not midway. Raises ClosedError once closed."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lifecycle:
            if self._closed:
                raise self._closed_error()
            return method(self, *args, **kwargs)
    return locked


class Pipeline:
    """A running graph. Iterating it yields one epoch of batches: (images, labels) by default,
    or a dict of every field plus "__key__" with output="dict". In a dict, a field batch collates as
    ragged is a list with one entry per sample (str for txt, parsed objects for json, bytes for other
    uint8 fields, 1-D arrays otherwise); a padded field is NAME [B,L] plus NAME.length [B] (docs/batches.md).

    graph: a graph file's path, or YAML text (which has a newline). rank / world_size: None takes
    RANK / WORLD_SIZE (torchrun) or 0 / 1. Each `for` over the pipeline is one epoch, the next one after
    the last (set_epoch() picks one); the graph's `epochs` is how many a CLI run makes and does not end a
    Pipeline. epochs: None or 0, no last epoch; N, epochs 0..N-1 only: iterating past them, set_epoch(N)
    and a state at epoch N raise the same ShardflowError (docs/resume.md). output: "torch", "numpy",
    "dict" (NumPy arrays) or "torch_dict"; None = torch when it imports, else numpy, in the tuple form
    when the graph has a `rename` stage. "tuple" (NumPy) or "torch_tuple": every field of the batch in
    its order, which a `rename` stage sets (its `names` order: "image=jpg;png,label=cls" gives (image,
    label)), a ragged field as its list; the dict forms are keyed by those names. "dlpack": a dict of
    every field as a DLPack producer (an object with __dlpack__ / __dlpack_device__, taken once, by
    torch.from_dlpack, jax.dlpack.from_dlpack, cupy.from_dlpack...) plus "__key__", ragged fields as
    NAME + NAME.offsets. With device_sink's device: cuda (docs/python.md, "On a GPU") fields are on the GPU: use a
    torch output or "dlpack" (NumPy cannot take them).
    map: {node name: callable} for the graph's `type: python` nodes (see shardflow._pymap; a node's
    `function: "pkg.module:fn"` is used where map names no callable).
    """

    def __init__(self, graph, rank=None, world_size=None, epochs=None, output=None, map=None, **options):
        self._pipeline = ctypes.c_void_p()
        # Threads: _cond guards _pipeline against close() while other threads are inside C calls on it
        # (_users of them; once _releasing, new calls raise instead of adding to them, or a thread calling in
        # a loop keeps close() waiting for ever); _lifecycle makes close() and restarts one at a time.
        self._cond, self._lifecycle, self._users, self._closed = threading.Condition(), threading.RLock(), 0, False
        self._releasing = False
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0):
            raise ValueError(f"epochs={epochs!r}: give a whole number of epochs, or 0 or None for no last epoch")
        if output is not None and output not in _OUTPUTS:
            raise ValueError(f"output={output!r}: use one of {', '.join(_OUTPUTS)}")
        self._maps = []
        self._args = (graph, rank, world_size, epochs or 0, options, dict(map or {}))
        self._start(0, 0)
        self._output = output or self._default_output(self._renamed)

    @classmethod
    def _load_graph(cls, graph, options):
        """The graph (a file's path or YAML text) with the keyword options applied; the caller
        destroys it (sf_graph_destroy). Raises ShardflowError."""
        g = ctypes.c_void_p()
        err = _Error()
        # YAML text has a newline: a string without one names a file, and a missing file is an error.
        if isinstance(graph, os.PathLike) or "\n" not in graph or os.path.exists(graph):
            r = library.sf_graph_load_file(ctypes.byref(g), os.fsencode(graph), ctypes.byref(err))
        else:
            r = library.sf_graph_load_string(ctypes.byref(g), str(graph).encode(), b"<string>", ctypes.byref(err))
        if r < 0:
            raise _error(r, err)
        try:
            for name, value in options.items():
                r = library.sf_graph_set(g, cls._target(g, name).encode(), _text(value).encode(), ctypes.byref(err))
                if r < 0:  # the engine's text says what; where the value came from is ours to say
                    e = _error(r, err)
                    raise ShardflowError(e.code, f"{e} (keyword argument {name}={value!r})")
        except BaseException:
            library.sf_graph_destroy(ctypes.byref(g))
            raise
        return g

    @_restarts
    def _start(self, first_epoch, first_step, plan=None, consumed=None):
        """Starts at batch first_step of first_epoch; plan: the (shard, sample) pairs that epoch
        reads instead of the rank's share (an elastic resume, shardflow/elastic.py); consumed: with
        shard_source's order: global, the samples of first_epoch all ranks consumed before (its start)."""
        options = self._args[4]
        self._release()
        self._empty = None  # load_state_dict's resumed epoch that has nothing left for this rank and worker
        self._plan, self._plan_epoch = plan, first_epoch
        self._consumed_base = consumed or 0
        if consumed is not None:
            options = dict(options, **{f"{source}__start": consumed for source in self._indexed[0]})
        plan_file = elastic.write_plan(plan) if plan is not None else None
        try:
            self._start_with(first_epoch, first_step, dict(options, plan=plan_file) if plan_file else options)
        finally:
            if plan_file:
                os.remove(plan_file)  # shard_source read it in sf_pipeline_new

    def _start_with(self, first_epoch, first_step, options):
        graph, rank, world_size, epochs, _, maps = self._args
        err = _Error()
        g = self._load_graph(graph, options)
        try:
            self._indexed = self._indexed_order(g)
            self._deal(g, self._indexed)
            self._maps = _pymap.start(g, maps)
            opts = _Options()
            library.sf_pipeline_options_init(ctypes.byref(opts))
            if rank is not None:
                opts.rank = rank
            if world_size is not None:
                opts.world_size = world_size
            opts.epochs = epochs  # 0 (no last epoch) unless the epochs argument set one: not the graph's
            opts.first_epoch, opts.first_step = first_epoch, first_step
            r = library.sf_pipeline_new(ctypes.byref(self._pipeline), g, ctypes.byref(opts), ctypes.byref(err))
            self._started = time.monotonic()
            if r < 0:
                raise _error(r, err)
            self._batches = self._epoch_batches(g)
            self._renamed = any(library.sf_graph_node_type(g, i).decode() == "rename"
                                for i in range(library.sf_graph_node_count(g)))
            self._counted_fingerprint = self._layout_free_fingerprint(g, self._indexed)
        except BaseException:
            self._release()
            raise
        finally:
            library.sf_graph_destroy(ctypes.byref(g))

    @staticmethod
    def _target(g, name):
        """A keyword argument as NODE.OPTION: NODE__OPTION, or the one node whose stage has OPTION."""
        if "__" in name:
            node, option = name.split("__", 1)
            return f"{node}.{option}"
        nodes = [library.sf_graph_node_name(g, i).decode() for i in range(library.sf_graph_node_count(g))
                 if library.sf_graph_node_has_option(g, i, name.encode())]
        if len(nodes) == 1:
            return f"{nodes[0]}.{name}"
        if not nodes:
            return name  # a graph setting (seed, epochs...) or a mistake sf_graph_set explains
        raise TypeError(f"option {name!r} belongs to several nodes ({', '.join(nodes)}): "
                        f"write NODE__{name}, e.g. {nodes[0]}__{name}")

    @staticmethod
    def _epoch_shape(g):
        """(samples_per_epoch, batch_size, partial) when shard_source (or a mix with stop: never) fixes
        samples_per_epoch, else None."""
        values = {}
        for i in range(library.sf_graph_node_count(g)):
            stage = library.sf_graph_node_type(g, i).decode()
            option = lambda o: library.sf_graph_node_option(g, i, o.encode()).decode()  # noqa: E731
            if stage == "mix" and option("stop") == "never":  # the mix's count is the rank's, whatever its inputs
                values["samples_per_epoch"] = option("samples_per_epoch")
            for name in {"shard_source": ("samples_per_epoch",), "batch": ("batch_size",)}.get(stage, ()):
                values.setdefault(name, option(name))
        try:
            samples, size = int(values["samples_per_epoch"]), int(values["batch_size"])
        except (KeyError, ValueError):
            return None
        if samples == 0:
            return None
        return samples, size, Pipeline._batch_partial(g)

    @staticmethod
    def _batch_partial(g):
        """Whether the graph's batch stage hands on an epoch's short last batch (its partial option)."""
        for i in range(library.sf_graph_node_count(g)):
            if library.sf_graph_node_type(g, i).decode() == "batch":
                return library.sf_graph_node_option(g, i, b"partial").decode() in ("true", "yes", "on", "1")
        return True

    def _epoch_positions(self, world, epoch):
        """order: global: the positions of epoch of this graph at world size world (shard_source's start
        runs to it): samples_per_epoch x ranks x workers, else the dataset's samples; a mix's positions: its
        samples_per_epoch x ranks, with stop: first those before an input would run out (the epoch's draws,
        sf_graph_mix_positions)."""
        g = self._load_graph(self._args[0], self._args[4])
        try:
            types = [library.sf_graph_node_type(g, i).decode() for i in range(library.sf_graph_node_count(g))]
            node = types.index("mix") if "mix" in types else next(
                i for i in range(library.sf_graph_node_count(g))
                if library.sf_graph_node_name(g, i).decode() == self._indexed[0][0])
            if types[node] == "mix" and library.sf_graph_node_option(g, node, b"stop").decode() == "first":
                self._deal(g, self._indexed_order(g))  # as the pipeline runs it: dealt, so the plan mixes by position
                n, err = ctypes.c_uint64(), _Error()
                r = library.sf_graph_mix_positions(g, epoch, world, ctypes.byref(n), ctypes.byref(err))
                if r < 0:
                    raise _error(r, err)
                return n.value
            option = lambda o: int(library.sf_graph_node_option(g, node, o.encode()).decode())  # noqa: E731
            if option("samples_per_epoch"):  # the rank's: Pipeline deals in rounds (shard_source's deal)
                return option("samples_per_epoch") * world
            size, err = ctypes.c_uint64(), _Error()
            r = library.sf_graph_dataset_size(g, ctypes.byref(size), ctypes.byref(err))
            if r < 0:
                raise _error(r, err)
            return size.value
        finally:
            library.sf_graph_destroy(ctypes.byref(g))

    @staticmethod
    def _indexed_order(g):
        """With shard_source's order: global or block, (its node names, batch size, why not, workers, worker):
        why not is None when the samples consumed so far are the epoch's first positions, every rank alike,
        so that their count says which ones they were; else what keeps it from saying so. Several shard_sources
        count only as the inputs of one mix by position (stop: never with samples_per_epoch, or stop: first;
        every input order: global): its positions are then the ones counted, and every input resumes from the same count. None
        for order: sequential or a graph without a batch stage."""
        sources, batch, why, workers, worker, mixes = [], None, None, 1, 0, []
        for i in range(library.sf_graph_node_count(g)):
            stage, name = library.sf_graph_node_type(g, i).decode(), library.sf_graph_node_name(g, i).decode()
            option = lambda o: library.sf_graph_node_option(g, i, o.encode()).decode()  # noqa: E731
            if stage == "shard_source":
                if option("order") not in ("global", "block"):
                    return None
                sources.append((name, option("order"), int(option("samples_per_epoch")), option("samples"),
                                (int(option("deal")), option("start"), option("workers"), option("worker"))))
                workers, worker = int(option("workers")), int(option("worker"))
            elif stage == "shuffle" and int(option("buffer_size")) > 1:
                why = f"the shuffle stage {name!r} reorders samples after they are read"
            elif stage == "mix":
                mixes.append((name, option("stop"), int(option("samples_per_epoch"))))
            elif stage == "pack":
                why = f"the pack stage {name!r} does not keep one sample per row"
            elif stage == "batch" and batch is None:
                batch = int(option("batch_size"))
        if not sources or batch is None:
            return None
        for name, stop, samples in mixes:
            # The deal Python sets (the batch size) where none is written; the plan needs every input dealt alike.
            dealt = {(d or batch, *rest) for *_, (d, *rest) in sources}
            how = ("an input reads order: block, samples_per_epoch or samples of its own"
                   if any(o != "global" or spe or picks for _, o, spe, picks, _ in sources)
                   else "its inputs' deal, start, workers or worker differ" if len(dealt) > 1
                   else f"stop: {stop}" if stop == "longest"
                   else "samples_per_epoch: 0" if not samples and stop == "never"
                   else "the graph has several mixes" if len(mixes) > 1 else None)
            if how:
                why = why or (f"the mix stage {name!r} draws its inputs from one stream per epoch ({how}; it mixes "
                              "by position only with stop: first, or stop: never and samples_per_epoch, over inputs "
                              "that are each shard_source order: global: with stop: longest an input that ran out "
                              "would leave holes in the dealt rounds), so how many samples each input gave depends "
                              "on the draws, not on the count of rows")
        if len(sources) > 1 and not mixes:
            why = why or "the graph reads several shard lists"
        return tuple(s[0] for s in sources), batch, why, workers, worker

    @staticmethod
    def _deal(g, indexed):
        """Deals the epoch's positions to ranks in rounds of one batch each (shard_source's deal = the batch
        size) when a count of consumed samples can resume the graph: the rank's t-th batch is then round t
        whatever its DataLoader workers, so k batches of every rank are the order's first k x batch x ranks
        positions. A deal the graph sets itself is kept."""
        if indexed is None or indexed[2] is not None:
            return
        for source in indexed[0]:
            node = next(i for i in range(library.sf_graph_node_count(g))
                        if library.sf_graph_node_name(g, i).decode() == source)
            if library.sf_graph_node_option(g, node, b"deal").decode() != "0":
                continue
            err = _Error()
            r = library.sf_graph_set(g, f"{source}.deal".encode(), str(indexed[1]).encode(), ctypes.byref(err))
            if r < 0:
                raise _error(r, err)

    @staticmethod
    def _layout_free_fingerprint(g, indexed):
        """The order fingerprint a state counting consumed samples carries: the graph's at one loader worker
        (rank x worker layouts resume each other's counts; with deal the rank's batches do not depend on
        workers), or None where consumed is not counted (the pipeline's own fingerprint)."""
        if indexed is None or indexed[2] is not None:
            return None
        err = _Error()
        for source in indexed[0]:
            for option, value in (("workers", b"1"), ("worker", b"0")):
                r = library.sf_graph_set(g, f"{source}.{option}".encode(), value, ctypes.byref(err))
                if r < 0:
                    raise _error(r, err)
        buf = ctypes.create_string_buffer(65)
        r = library.sf_graph_order_fingerprint(g, buf, len(buf), ctypes.byref(err))
        if r < 0:
            raise _error(r, err)
        return buf.value.decode()

    @classmethod
    def _epoch_batches(cls, g):
        """Batches per epoch when shard_source fixes samples_per_epoch, else None."""
        shape = cls._epoch_shape(g)
        return None if shape is None else cls._epoch_batches_of(shape)

    def _rank_batches(self, epoch=None):
        """order: global / block dealt in rounds (deal), without samples_per_epoch: the batches of this rank's
        epoch (the pipeline's when None), from the dataset's size (rounds of batch x ranks positions, the short
        last one dealt a position at a time: the rank gets n // ranks samples, one more when rank < n % ranks)."""
        rank, world = self._placement()
        n = self._epoch_positions(world, self.epoch if epoch is None else epoch)
        g = self._load_graph(self._args[0], self._args[4])
        try:
            partial = self._batch_partial(g)
        finally:
            library.sf_graph_destroy(ctypes.byref(g))
        mine = n // world + (1 if rank < n % world else 0)
        return self._epoch_batches_of((mine, self._indexed[1], partial))

    @staticmethod
    def _epoch_batches_of(shape):
        """Batches of an epoch of _epoch_shape() shape: (samples, batch size, partial)."""
        full, rest = divmod(shape[0], shape[1])
        return full + (1 if rest and shape[2] else 0)

    @_uses_pipeline
    def __len__(self):
        """Batches per epoch on this rank (known when shard_source sets samples_per_epoch)."""
        if self._batches is None:
            raise TypeError("the epoch length is not fixed: set shard_source's samples_per_epoch to have len()")
        return self._batches

    @staticmethod
    def _default_output(renamed):
        """torch when it imports, else numpy; the tuple forms when the graph has a rename stage (its names
        say what the trainer unpacks: image=jpg,label=cls gives (image, label), not (4-D field, cls))."""
        try:
            import torch  # noqa: F401
            return "torch_tuple" if renamed else "torch"
        except ImportError:
            return "tuple" if renamed else "numpy"

    @property
    @_uses_pipeline
    def epoch(self):
        """Epoch of the batches being returned (0-based)."""
        if self._empty is not None:
            return self._empty["epoch"]
        return library.sf_pipeline_epoch(self._pipeline)

    @property
    @_uses_pipeline
    def step(self):
        """Batches returned in this epoch."""
        if self._empty is not None:
            return 0
        return library.sf_pipeline_step(self._pipeline)

    @_uses_pipeline
    def state_dict(self):
        """The position to resume from: every batch is a function of the graph, seed, rank, world
        size and position, so this is the whole state (a small dict, picklable), with "fingerprint", the
        graph's order fingerprint (sf_pipeline_order_fingerprint: what decides the order, hashed), which
        load_state_dict() compares. In an epoch resumed at another world size it also holds "plan", the
        [shard, sample] pairs the epoch reads (8-16 bytes a sample in a pickle). With shard_source's order:
        global or block it holds "consumed", the samples of the epoch every rank consumed (docs/resume.md,
        "With an index"), and with several loader workers "workers" and "worker": a worker's count is the
        rank's when the rank's next batch is that worker's, so the rank's state is its workers' with the
        least "consumed" (or PipelineDataset.state_dict(batches=...) in the trainer's process)."""
        if self._empty is not None:
            return dict(self._empty)
        state = {"epoch": self.epoch, "step": self.step, "rank": library.sf_pipeline_rank(self._pipeline),
                 "world_size": library.sf_pipeline_world_size(self._pipeline),
                 "fingerprint": self._fingerprint()}
        if self._plan is not None and self.epoch == self._plan_epoch:
            state["plan"] = [list(pair) for pair in self._plan]
        if self._indexed is not None and self._indexed[2] is None:
            # order: global / block dealt in rounds: the ranks consumed the epoch's first positions, so a count
            # says which; the next ones go on at any world size and workers (shard_source's start). A loader
            # worker's count is the rank's if the rank's next batch is this worker's (its round is next).
            _, batch, _, workers, worker = self._indexed
            base = self._consumed_base if self.epoch == self._plan_epoch else 0
            state["consumed"] = base + (state["step"] * workers + worker) * batch * state["world_size"]
            if workers > 1:
                state["workers"], state["worker"] = workers, worker
        return state

    def load_state_dict(self, state):
        """Continues exactly where state was taken: the next batches are those the uninterrupted run
        returned next. A state from another world size resumes when it is shardflow.merge_states()
        of every rank's state: the rest of its epoch is dealt to this world's ranks, no sample repeated
        or lost (docs/resume.md; every new rank replays the old ranks' epoch to find what they
        consumed). Raises ValueError when the state cannot say that (one rank's state from another
        world size, a graph with samples_per_epoch or several workers), when it is not what
        state_dict() or merge_states() returns (a type, a key, a negative number, steps or plans not
        one per rank), or when its fingerprint is not this graph's (another seed, shard list, batch
        size...: the order would differ). A state without a fingerprint (from an older shardflow)
        resumes unchecked, with a warning. The pipeline is unchanged after a ValueError."""
        rank, world = self._placement()
        state = elastic.check_state(state)
        elastic.check_fingerprint(state, self._fingerprint())
        self._check_epoch(int(state["epoch"]))
        if "consumed" in state and self._indexed is not None:
            consumed = elastic._whole(state["consumed"], "consumed")
            if self._indexed[2] is not None:
                raise ValueError(f"the state counts consumed samples, which cannot say which samples this graph "
                                 f"consumed: {self._indexed[2]}; resume at the same world size with a state "
                                 "without 'consumed'")
            _, batch, _, workers, worker = self._indexed
            if "workers" in state:
                saved = (elastic._whole(state["workers"], "workers", 1), elastic._whole(state.get("worker"), "worker"),
                         state["world_size"])
                if saved == (workers, worker, world):
                    # The same loader worker of the same layout (torchdata's per-worker protocol): this worker
                    # goes on with its own next round, whichever worker the rank takes its next batch from.
                    consumed -= min(consumed, worker * batch * world)
            epoch = int(state["epoch"])
            positions = self._epoch_positions(world, epoch)
            if consumed >= positions:  # saved after the epoch's last batch: the next one
                self._check_epoch(epoch + 1)
                return self._start(epoch + 1, 0)
            # This rank and worker's first round of the rest (shard_source's deal): none is left for it when the
            # rest is shorter (a DataLoader worker past the epoch's last batch). The engine refuses an epoch that
            # delivers nothing, so the rest of this one is empty here and the pipeline starts the next.
            rnd, left = batch * world, positions - consumed
            if not (worker < left // rnd or (worker == left // rnd and rank < left % rnd)):
                self._check_epoch(epoch + 1)
                self._start(epoch + 1, 0)
                self._empty = {"epoch": epoch, "step": 0, "rank": rank, "world_size": world,
                               "fingerprint": self._fingerprint(), "consumed": consumed + worker * batch * world}
                if workers > 1:
                    self._empty.update(workers=workers, worker=worker)
                return None
            return self._start(epoch, 0, consumed=consumed)
        if "steps" in state:  # merge_states(): every rank's position
            if state["world_size"] == world:
                plan = state["plans"][rank] if state.get("plans") else None
                return self._start(int(state["epoch"]), int(state["steps"][rank]), plan)
            graph, options = self._args[0], self._args[4]
            pairs = elastic.plan(Pipeline, graph, options, state, rank, world)
            return self._start(int(state["epoch"]), 0, [tuple(p) for p in pairs])
        if (state["rank"], state["world_size"]) != (rank, world):
            raise ValueError(f"state saved as rank {state['rank']} of {state['world_size']} cannot resume "
                             f"rank {rank} of {world}: it says where one rank stood, not where every rank did; "
                             "to resume at another world size pass shardflow.merge_states() of every rank's "
                             "state_dict() (docs/resume.md), else resume with the same world size")
        self._start(int(state["epoch"]), int(state["step"]), state.get("plan"))

    @_uses_pipeline
    def _fingerprint(self):
        """The graph's order fingerprint (sf_pipeline_order_fingerprint), 64 hex digits; where the state counts
        consumed samples, the graph's at one loader worker (the count resumes at any workers)."""
        if getattr(self, "_counted_fingerprint", None):
            return self._counted_fingerprint
        return library.sf_pipeline_order_fingerprint(self._pipeline).decode()

    @_uses_pipeline
    def _placement(self):
        """(rank, world size) the pipeline runs as."""
        return library.sf_pipeline_rank(self._pipeline), library.sf_pipeline_world_size(self._pipeline)

    @_uses_pipeline
    def _next_origins(self, timeout=-1.0):
        """The next batch as its rows' (shard index, sample index) pairs, fields not converted;
        None at the end of the epoch. Raises ShardflowError."""
        b = ctypes.c_void_p()
        r = library.sf_pipeline_next(self._pipeline, ctypes.byref(b), timeout)
        if r == SF_EOF:
            return None
        if r < 0:
            raise self._failure(r)
        try:
            shard, sample = ctypes.c_uint64(), ctypes.c_uint64()
            out = []
            for j in range(library.sf_batch_size(b)):
                library.sf_batch_origin(b, j, ctypes.byref(shard), ctypes.byref(sample))
                out.append((shard.value, sample.value))
            return out
        finally:
            library.sf_batch_destroy(ctypes.byref(b))

    def set_epoch(self, epoch):
        """Starts epoch `epoch` (0-based) from its beginning (DistributedSampler's set_epoch): the next
        `for` yields that epoch, the one after it the next. Without it each `for` goes on with the next
        epoch anyway. Raises ShardflowError for an epoch past the epochs argument (as iterating past it
        and load_state_dict() do); the pipeline is then unchanged."""
        epoch = int(epoch)
        self._check_epoch(epoch)
        if epoch != self.epoch or self.step != 0:
            self._start(epoch, 0)

    def _check_epoch(self, epoch):
        """Raises the one ShardflowError for an epoch past the Pipeline's epochs argument (none: no limit)."""
        limit = self._args[3]
        if limit and epoch >= limit:
            raise ShardflowError("SF_EOPTION", f"cannot start at epoch {epoch}: the pipeline has {limit} epochs "
                                               f"(0..{limit - 1}, its epochs argument); call set_epoch() with an "
                                               f"epoch below {limit} or load_state_dict() with an earlier state, or "
                                               "make the Pipeline with a larger epochs (0: no limit)")

    @_uses_pipeline
    def stats(self):
        """The nodes' counters so far (sf_pipeline_stats), one dict per node in the graph's order:
        name, type (stage), replicas, items (produced), bytes (payload produced, as the stage counts
        it), busy_seconds (wall-clock inside its steps), wait_seconds (waiting for input), errors
        (records raised), skipped (samples dropped under the skip policy), filtered (dropped on
        purpose by a filter stage), counters (the stage's own counts by name, for a stage that
        keeps some: sf_node_counter_add), what the stage reports of its own (its stats callback, as
        --stats-json): tuned (the options it tunes while running: value, initial, pinned, changes,
        changed_at), reader (a shard reader: read_seconds, and with downloads downloaded_bytes,
        refetched_bytes, retries, cache_hits, prefetch), group (a group's node: live workers,
        reassigned, duplicates, malformed, refused, ring_bytes, socket_bytes and workers, each with
        name, pid, live, samples, units, rate and its own stages' table), and the rates over the
        pipeline's life so far: items_per_second and mib_per_second (per wall-clock second since
        the pipeline started; set_epoch and load_state_dict start a new one, from zero). The
        numbers are those `shardflow run` prints at its end."""
        n = library.sf_pipeline_stats(self._pipeline, None, 0)
        table = (_NodeStats * n)()
        n = min(n, library.sf_pipeline_stats(self._pipeline, table, n))
        elapsed = max(time.monotonic() - self._started, 1e-9)
        nodes = []
        for s in table[:n]:
            node = {name: getattr(s, name) for name, _ in _NodeStats._fields_}
            node["name"], node["type"] = s.name.decode(), s.type.decode()
            del node["n_inputs"], node["input_names"], node["input_items"]
            del node["n_counters"], node["counter_names"], node["counters"], node["stage"]
            node.update(self._stage_stats(s))
            if s.n_inputs > 1:  # a mix: what each input gave, by the name of the node feeding it
                node["input_items"] = {s.input_names[j].value.decode(): s.input_items[j] for j in range(min(s.n_inputs, 64))}
            if s.n_counters > 0:  # the stage's own counters (sf_node_counter_add), by name
                node["counters"] = {s.counter_names[j].value.decode(): s.counters[j] for j in range(min(s.n_counters, 4))}
            node["items_per_second"] = s.items / elapsed
            node["mib_per_second"] = s.bytes / 1048576.0 / elapsed
            nodes.append(node)
        return nodes

    def _stage_stats(self, s):
        """What a node's stage reports of its own (sf_node_stats.stage): the options it tunes, a shard reader's
        reads and downloads, a group's counts and workers (sf_pipeline_workers)."""
        x, out = s.stage, {}
        if x.n_tuned > 0:
            out["tuned"] = {t.option.decode(): {"value": t.value, "initial": t.initial, "pinned": t.pinned,
                                                "changes": t.changes, "changed_at": t.changed_at}
                            for t in x.tuned[:min(x.n_tuned, 4)]}
        if x.reads:
            out["reader"] = {"read_seconds": x.read_ns * 1e-9}
            if x.reader:
                out["reader"].update({k: getattr(x, k) for k in ("downloaded_bytes", "refetched_bytes", "retries",
                                                                  "cache_hits", "prefetch")})
        if x.group:
            n = library.sf_pipeline_workers(self._pipeline, s.name, None, 0)
            workers = (_WorkerStats * max(n, 1))()
            n = min(n, library.sf_pipeline_workers(self._pipeline, s.name, workers, n))
            out["group"] = {"live": x.workers, **{k: getattr(x, k) for k in (
                "reassigned", "duplicates", "malformed", "refused", "ring_bytes", "socket_bytes")}, "workers": [
                {"name": w.name.decode(errors="replace"), "pid": w.pid, "live": w.live, "samples": w.samples,
                 "units": w.units, "rate": w.rate, "stages": [
                     {k: (getattr(t, k).decode() if k == "name" else getattr(t, k)) for k, _ in _WorkerStageStats._fields_}
                     for t in w.stages[:min(w.n_stages, 64)]]} for w in workers[:n]]}
        return out

    @_uses_pipeline
    def fileno(self):
        """A descriptor readable while the next batch is ready (for select/poll/asyncio); valid until close()."""
        return library.sf_pipeline_fd(self._pipeline)

    @_uses_pipeline
    def next_batch(self, timeout=-1.0):
        """The next batch in the chosen output form; None at the end of the epoch (the next call
        goes on with the next epoch); raises TimeoutError, ShardflowError (the error that stopped the
        run, or the epochs argument's last epoch is past), ClosedError (closed, also by another thread
        meanwhile), or the SystemExit or
        KeyboardInterrupt a map function raised."""
        self._check_epoch(self.epoch)  # past the last epoch: said, not an empty iteration
        if self._empty is not None:  # a resumed epoch with nothing left for this worker: its end
            self._empty = None
            return None
        b = ctypes.c_void_p()
        # Waits in slices: Python runs signal handlers (Ctrl-C's KeyboardInterrupt) between calls only.
        # A slice that runs out is SF_ETIMEDOUT, as is a run that failed with a timeout of its own (a
        # stalled download): sf_pipeline_failed tells them apart.
        deadline = time.monotonic() + timeout if timeout >= 0 else None
        while True:
            left = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, max(0.0, deadline - time.monotonic()))
            r = library.sf_pipeline_next(self._pipeline, ctypes.byref(b), left)
            if r != SF_ETIMEDOUT or library.sf_pipeline_failed(self._pipeline) or \
                    (deadline is not None and time.monotonic() >= deadline):
                break
        if r == SF_EOF:
            return None
        if r < 0:
            if r == SF_ETIMEDOUT and not library.sf_pipeline_failed(self._pipeline):
                raise TimeoutError(f"no batch within {timeout} s")
            raise self._failure(r)
        try:
            return self._convert(b)
        finally:
            library.sf_batch_destroy(ctypes.byref(b))

    def _convert(self, b):
        if self._output.startswith("torch"):
            import torch
            take = torch.from_dlpack
        elif self._output == "dlpack":
            take = None
        else:
            import numpy
            take = numpy.from_dlpack
        numpy_out = take is not None and not self._output.startswith("torch")
        fields = {}
        for i in range(library.sf_batch_field_count(b)):
            managed = ctypes.c_void_p()
            r = library.sf_batch_to_dlpack(b, i, ctypes.byref(managed))
            if r < 0:
                raise _error(r)
            field = _Field(managed.value)
            if numpy_out and field._device[0] != _KDLCPU:
                raise ShardflowError("SF_EUNSUPPORTED", f"output={self._output!r}: the batch is on the GPU "
                                     "(device_sink's device: cuda) and NumPy takes host memory only; use "
                                     "output='torch', 'torch_dict', 'torch_tuple' or 'dlpack'")
            fields[library.sf_batch_field_name(b, i).decode()] = take(field) if take else field
        if self._output == "dlpack":
            fields["__key__"] = [library.sf_batch_key(b, j).decode() for j in range(library.sf_batch_size(b))]
            return fields
        if self._output.endswith("dict"):
            _unpack_ragged(fields)
            fields["__key__"] = [library.sf_batch_key(b, j).decode() for j in range(library.sf_batch_size(b))]
            return fields
        if self._output.endswith("tuple"):
            _unpack_ragged(fields)  # a ragged field is one item (its list), not two (values, offsets)
            return tuple(fields.values())  # the batch's field order: a rename stage's `names` order
        images = next((v for v in fields.values() if v.ndim == 4), None)
        return images, fields.get("cls")

    def __iter__(self):
        while True:
            batch = self.next_batch()
            if batch is None:
                return
            yield batch

    @property
    @_uses_pipeline
    def metrics_port(self):
        """The TCP port /metrics is served on (graph setting `metrics`, or metrics="HOST:0" as a
        keyword: port 0 picks a free one, this tells which); None without the setting."""
        return library.sf_pipeline_metrics_port(self._pipeline) or None

    @_uses_pipeline
    def bottleneck(self):
        """One line naming the stage that limits throughput and the remedy, judged from busy/wait times
        since the pipeline started (rule: docs/bottleneck.md), e.g. "bottleneck: decode (decode, busy 97%
        of 1 replica(s)): CPU-bound; set decode.replicas: 2"."""
        buf = ctypes.create_string_buffer(1024)
        library.sf_pipeline_bottleneck(self._pipeline, buf, len(buf))
        return buf.value.decode()

    def _failure(self, r):
        """The exception for next()'s error code r: ClosedError when close() stopped it from another thread;
        a map function's SystemExit or KeyboardInterrupt (once); else the run's error record as
        ShardflowError (caused by the map's other BaseException, if one stopped it)."""
        if r == SF_ECANCELED and not library.sf_pipeline_failed(self._pipeline):
            return self._closed_error()
        stop = _pymap.raised(self._maps)
        if isinstance(stop, (SystemExit, KeyboardInterrupt)):
            return stop
        err = _Error()
        error = _error(r, err if library.sf_pipeline_last_error(self._pipeline, ctypes.byref(err)) else None)
        if stop is not None:
            error.__cause__ = stop
        return error

    def _closed_error(self):
        graph = self._args[0] if hasattr(self, "_args") else "?"
        name = "<string>" if isinstance(graph, str) and "\n" in graph else os.fspath(graph)
        if self._closed:
            return ClosedError("SF_ECANCELED", f"pipeline '{name}' is closed")
        return ClosedError("SF_ECANCELED", f"pipeline '{name}' is not running: its restart (load_state_dict, "
                                           "set_epoch) failed, or is under way in another thread")

    def _release(self):
        """Stops and frees the C pipeline (not permanent: _start makes a new one). Waits for the calls
        other threads are making on it, after waking a next() that waits for a batch."""
        with self._lifecycle:
            with self._cond:
                self._releasing = True
                if self._pipeline:
                    library.sf_pipeline_stop(self._pipeline)
            _pymap.stop(getattr(self, "_maps", []))  # before the destroy: a map thread may hold a sample
            self._maps = []
            with self._cond:
                while self._users:
                    self._cond.wait()
                if self._pipeline:
                    library.sf_pipeline_destroy(ctypes.byref(self._pipeline))
                self._releasing = False

    def close(self):
        """Stops the threads and frees the pipeline; batches already returned stay valid. Callable from
        any thread: a next_batch() or iteration in another thread wakes and raises ClosedError, as every
        later use does (a ShardflowError: "pipeline 'graphs/x.yaml' is closed"). Closing again does nothing."""
        if not hasattr(self, "_lifecycle"):
            return  # __init__ failed before anything started
        with self._cond:
            self._closed = True
        self._release()

    @_uses_pipeline
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def _unpack_ragged(fields):
    """Ragged batch fields (NAME + NAME.offsets: batch's `ragged` option, and text fields by default) become one
    list entry per sample: `txt` (and NAME.txt, text, transcript) -> list[str] (UTF-8), `json` (and NAME.json,
    jsn) -> list of json.loads() objects, other
    uint8 fields -> list[bytes], other dtypes -> list of 1-D arrays or tensors (views of the values, no copy).
    Padded fields (NAME [B,L] + NAME.length int32 [B], the `pad` option) stay as they are."""
    import json
    for name in [n[:-len(".offsets")] for n in fields if n.endswith(".offsets")]:
        if name not in fields:
            continue
        values, offsets = fields[name], fields.pop(name + ".offsets")
        if getattr(offsets, "is_cuda", False):  # device_sink's device: cuda: offsets read on the host at once
            offsets = offsets.cpu()
        if getattr(values, "is_cuda", False) and str(values.dtype) == "torch.uint8":  # bytes and text: host data
            values = values.cpu()
        offsets = [int(o) for o in offsets]
        parts = [values[offsets[j]:offsets[j + 1]] for j in range(len(offsets) - 1)]
        if str(values.dtype) in ("uint8", "torch.uint8"):
            parts = [bytes(p.numpy() if hasattr(p, "numpy") else p) for p in parts]
            kind = name.rsplit(".", 1)[-1]
            if kind in ("txt", "text", "transcript", "__key__"):  # __key__: rename's key field
                parts = [p.decode("utf-8") for p in parts]
            elif kind in ("json", "jsn"):
                parts = [json.loads(p) for p in parts]
        fields[name] = parts


class Dataset:
    """A map-style dataset over the graph's indexed shards (docs/data.md, "Indexed shards"): len(ds) is the
    number of samples of shard_source's dataset (from the shards' indexes, made on first use), ds[i] the sample
    with dataset index i (sample i of the shards in list order) through the graph's stages up to its batch,
    as a dict of field -> that sample's row (arrays, or a list entry for a ragged field) plus "__key__".
    ds.__getitems__(indices) reads many in one pass, which torch's DataLoader uses with its samplers
    (DataLoader(ds, batch_size=64, shuffle=True)): every call runs the graph once, as one rank, over exactly
    those samples (shard_source's order: global with samples), so give it many at a time. A shuffle stage
    is bypassed (its buffer_size set to 1) and the batch stage keeps its last short batch; random stages
    (augment) draw as in any run of the graph's seed. Keyword options are the stages' (as Pipeline's).
    Raises ShardflowError when the graph has no shard_source or an index cannot be read (a stale one
    names both files), ValueError for a graph with a pack or mix stage (rows would not be samples)."""

    def __init__(self, graph, **options):
        self._graph, self._options = graph, dict(options)
        g = Pipeline._load_graph(graph, options)
        try:
            size, err = ctypes.c_uint64(), _Error()
            r = library.sf_graph_dataset_size(g, ctypes.byref(size), ctypes.byref(err))
            if r < 0:
                raise _error(r, err)
            self._len = size.value
            forced = {}
            for i in range(library.sf_graph_node_count(g)):
                stage, name = library.sf_graph_node_type(g, i).decode(), library.sf_graph_node_name(g, i).decode()
                if stage in ("pack", "mix"):
                    raise ValueError(f"the {stage} stage {name!r} does not give one row per sample: a map-style "
                                     "Dataset needs a graph whose batch rows are its samples")
                if stage == "shard_source" and not hasattr(self, "_source"):
                    forced[f"{name}__order"], self._source = "global", name
                elif stage == "shuffle":
                    forced[f"{name}__buffer_size"] = 1
                elif stage == "batch":
                    forced[f"{name}__partial"] = True
            self._forced = forced
        finally:
            library.sf_graph_destroy(ctypes.byref(g))

    def __len__(self):
        return self._len

    def __getitem__(self, i):
        import operator
        if not hasattr(i, "__index__"):  # a batch of indices: DataLoader(ds, sampler=BatchSampler(...), batch_size=None)
            return self.__getitems__(list(i))
        i = operator.index(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"dataset index {i} out of range: the dataset has {self._len} samples")
        return self.__getitems__([i])[0]

    def __getitems__(self, indices):
        """The samples with these dataset indices, in this order (a list of dicts, see the class)."""
        import operator
        import tempfile
        picks = []
        for i in indices:
            i = operator.index(i)
            if not 0 <= i < self._len:
                raise IndexError(f"dataset index {i} out of range: the dataset has {self._len} samples")
            picks.append(i)
        if not picks:
            return []
        fd, path = tempfile.mkstemp(prefix="shardflow-samples-", suffix=".txt")
        try:
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{i}\n" for i in picks))
            options = dict(self._options, **self._forced, **{f"{self._source}__samples": path})
            pipeline = Pipeline(self._graph, rank=0, world_size=1, epochs=1, output="dict", **options)
            rows = []
            try:
                for batch in pipeline:
                    n = len(batch["__key__"])
                    rows += [{k: v[j] for k, v in batch.items()} for j in range(n)]
            finally:
                pipeline.close()
        finally:
            os.remove(path)
        if len(rows) != len(picks):
            raise ShardflowError(-5, f"{len(picks) - len(rows)} of the {len(picks)} samples asked for were skipped "
                                 "(see the errors logged on the shardflow logger)")
        return rows


def dataset(graph, **kwargs):
    """The pipeline as a torch.utils.data.IterableDataset for DataLoader(ds, batch_size=None)
    (shardflow.torch.PipelineDataset): each iteration is one epoch of (images, labels) tensors;
    set_epoch() reaches every DataLoader worker; each worker runs its own pipeline over its own
    shards and its share of samples_per_epoch; len() is the rank's batches per epoch."""
    from .torch import PipelineDataset
    return PipelineDataset(graph, **kwargs)


def _stage_help(stage=None):
    size = library.sf_stage_help(stage.encode() if stage else None, None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    library.sf_stage_help(stage.encode() if stage else None, buf, len(buf))
    return buf.value.decode()


# Keyword arguments are the stages' options: their reference comes from the same tables the engine
# parses graph files with, not from a second list here.
Pipeline.__doc__ += "\n\nStage options (keyword arguments):\n\n" + "\n".join(
    _stage_help(line.split(":", 1)[0]) for line in _stage_help().splitlines())


from . import _pymap  # noqa: E402  (Python map functions; uses library and the names above)
