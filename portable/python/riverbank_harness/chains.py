"""Lean chains: a run of simple transforms inside a fused stage, executed as one loop over
batches of elements instead of one Beam operation per transform.

Beam's Python SDK harness hands every element to an operation per transform: a receiver, a
DoFn runner, an output handler and a WindowedValue each time, and WindowInto computes its
windows with pure-Python Timestamp arithmetic. On a pipeline of small lambdas that machinery,
not the user's code, is most of the CPU. Here the transforms whose behaviour needs nothing
from the harness but the element are taken out of a bundle descriptor and replaced by one
operation that runs them together, batch by batch, with the same results:

- ParDo of a Python DoFn that Beam would call with the element alone (its SimpleInvoker case:
  no side inputs, extra arguments, DoFn parameters, state, timers, restrictions or batches,
  no finish_bundle; setup, start_bundle and teardown are called as Beam calls them);
- WindowInto (FixedWindows and GlobalWindows computed on integer microseconds, any other
  WindowFn through its own assign);
- the precombine of a lifted CombinePerKey (Beam's partial group-by-key, mirrored).

Outputs keep Beam's rules: an element inherits its input's timestamp, windows and pane; a
TimestampedValue is assigned windows by the input's WindowFn; a TaggedOutput goes to its tag
(dropped when no consumer declared it); a WindowedValue is taken as it is. User metrics count
under each transform's own name, element counts are reported for every PCollection inside,
and an exception names the transform it came from, as Beam's DoFnRunner names it.
Anything else in the descriptor is left to Beam's own operations.

Outputs are handed on a batch at a time, so (as Beam's programming guide asks) a DoFn must not
change an element after it outputs it; Beam's harness, one element at a time, does not notice.
A chain's input waits for a batch only when it was decoded from the data channel: what another
operation hands over (a stateful DoFn's lazily read bag) is run before that operation goes on.
"""
import itertools
import logging
import sys
import traceback

from apache_beam.internal import pickler
from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.cells import DistributionData
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.portability import common_urns
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.pvalue import TaggedOutput
from apache_beam.runners import common
from apache_beam.runners.worker import bundle_processor
from apache_beam.runners.worker import operations
from apache_beam.transforms import combiners
from apache_beam.transforms import core
from apache_beam.transforms import window
from apache_beam.utils import proto_utils
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN
from apache_beam.utils.windowed_value import WindowedValue

_LOGGER = logging.getLogger(__name__)

URN = "riverbank:transform:lean_chain:v1"
# Elements per batch handed from one transform to the next.
BATCH = 1024
# Chains made in this process (read by tests).
built = 0

_BATCH_INPUTS = "riverbank:lean_chain:batch_inputs"
_PAR_DO = common_urns.primitives.PAR_DO.urn
_WINDOW_INTO = common_urns.primitives.ASSIGN_WINDOWS.urn
_PRECOMBINE = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
_SPECIAL = (TaggedOutput, window.TimestampedValue, WindowedValue)
_GLOBAL = (window.GlobalWindow(), )
_MIN_MICROS = MIN_TIMESTAMP.micros
_create = windowed_value.create


def _probe(x):
    return x


# The wrappers Beam's Map and Filter put around the user's function (`lambda x: [fn(x)]`,
# `lambda x, ...: [x] if fn(x, ...) else []`): recognised by their code, the function is called
# directly. Another Beam version's wrappers differ, and are run as any DoFn.
_MAP_CODE = core.Map(_probe).fn._fn.__code__
_FILTER_CODE = core.Filter(_probe).fn._fn.__code__


def _wrapped(fn):
    """('map' or 'filter', the user's function) for a Map's or Filter's DoFn, else (None, None)."""
    if type(fn) is not core.CallableWrapperDoFn:
        return None, None
    wrapper = fn._fn
    code = getattr(wrapper, '__code__', None)
    kind = 'map' if code == _MAP_CODE else 'filter' if code == _FILTER_CODE else None
    if kind is None or not wrapper.__closure__:
        return None, None
    return kind, wrapper.__closure__[code.co_freevars.index('fn')].cell_contents


def install():
    """Makes every bundle processor of this harness run lean chains where it can."""
    if getattr(bundle_processor.BundleProcessor, '_lean_chains', False):
        return
    original = bundle_processor.BundleProcessor.__init__

    def __init__(self, runner_capabilities, process_bundle_descriptor, *args, **kwargs):
        original(self, runner_capabilities, rewrite(process_bundle_descriptor), *args, **kwargs)

    bundle_processor.BundleProcessor.__init__ = __init__
    bundle_processor.BundleProcessor._lean_chains = True
    bundle_processor.BeamTransformFactory.register_urn(URN, None)(_create_chain)


# ---------------------------------------------------------------------------------------------
# Choosing the chains


def _main_input(transform):
    inputs = list(transform.inputs.values())
    return inputs[0] if len(inputs) == 1 else None


def _simple_pardo(transform):
    """The DoFn's pickled data, if Beam would call its process with the element alone."""
    payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.ParDoPayload)
    if (payload.side_inputs or payload.state_specs or payload.timer_family_specs or
        payload.restriction_coder_id or payload.requests_finalization or
        payload.requires_stable_input or payload.requires_time_sorted_input or
        payload.on_window_expiration_timer_family_spec):
        return None
    if (payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO and
        payload.do_fn.urn not in core.StatelessDoFnInfo.REGISTERED_DOFNS):
        return None
    data = pickler.loads(
        core.DoFnInfo.from_runner_api(payload.do_fn, None).serialized_dofn_data())
    fn, args, kwargs = data[0], data[1], data[2]
    if args or kwargs or not isinstance(fn, core.DoFn):
        return None
    signature = common.DoFnSignature(fn)
    if (any(map(_is_param, signature.process_method.defaults)) or
        any(map(_is_param, signature.start_bundle_method.defaults)) or
        signature.is_stateful_dofn() or signature.is_splittable_dofn() or
        fn._process_batch_defined or fn._process_yields_batches or
        getattr(type(fn), 'finish_bundle', None) is not core.DoFn.finish_bundle or
        'finish_bundle' in vars(fn)):
        return None
    return data


def _is_param(default):
    """Whether a default of process is one Beam fills in (window, timestamp, state, ...);
    other defaults are the function's own, and Beam calls it without them too."""
    return isinstance(default, core._DoFnParam) or (
        isinstance(default, type) and issubclass(default, core._DoFnParam))


def _eligible(transform):
    urn = transform.spec.urn
    if _main_input(transform) is None:
        return False
    if urn == _PAR_DO:
        try:
            return _simple_pardo(transform) is not None
        except Exception:  # pylint: disable=broad-except
            # Whatever Beam cannot unpickle here it will report itself.
            return False
    return urn in (_WINDOW_INTO, _PRECOMBINE)


def rewrite(descriptor):
    """The descriptor with each chain of two or more eligible transforms as one transform."""
    try:
        return _rewrite(descriptor)
    except Exception:  # pylint: disable=broad-except
        _LOGGER.warning("lean chains not used for bundle descriptor %s", descriptor.id,
                        exc_info=True)
        return descriptor


def _rewrite(descriptor):
    producer = {}
    for tid, t in descriptor.transforms.items():
        for pcoll in t.outputs.values():
            producer[pcoll] = tid
    consumers = {}
    for tid, t in descriptor.transforms.items():
        for pcoll in t.inputs.values():
            consumers.setdefault(pcoll, []).append(tid)
    eligible = {tid for tid, t in descriptor.transforms.items() if _eligible(t)}

    # A chain grows from a root (an eligible transform whose input comes from outside the
    # chains) through the eligible consumers of what it outputs.
    chains = []
    for tid in sorted(eligible):
        if producer.get(_main_input(descriptor.transforms[tid])) in eligible:
            continue
        members, frontier = [], [tid]
        while frontier:
            current = frontier.pop()
            members.append(current)
            for pcoll in descriptor.transforms[current].outputs.values():
                frontier.extend(c for c in consumers.get(pcoll, []) if c in eligible)
        if len(members) > 1:
            chains.append(members)
    if not chains:
        return descriptor

    rewritten = beam_fn_api_pb2.ProcessBundleDescriptor()
    rewritten.CopyFrom(descriptor)
    for members in chains:
        inside = set(members)
        root = members[0]
        part = beam_fn_api_pb2.ProcessBundleDescriptor()
        exits = []
        for tid in members:
            transform = descriptor.transforms[tid]
            part.transforms[tid].CopyFrom(transform)
            del rewritten.transforms[tid]
            for pcoll in transform.outputs.values():
                if any(c not in inside for c in consumers.get(pcoll, [])):
                    exits.append(pcoll)
        chain = rewritten.transforms["lean:" + root]
        chain.unique_name = "lean chain of %s" % ", ".join(
            descriptor.transforms[tid].unique_name for tid in members)
        chain.spec.urn = URN
        chain.spec.payload = part.SerializeToString()
        chain.inputs["in"] = _main_input(descriptor.transforms[root])
        # Elements decoded from the data channel belong to nobody else and may wait for a
        # batch; another operation's output (a stateful DoFn's lazily read bag) is run at once,
        # before that operation goes on.
        source = descriptor.transforms.get(producer.get(chain.inputs["in"]))
        if source is not None and source.spec.urn == bundle_processor.DATA_INPUT_URN:
            chain.annotations[_BATCH_INPUTS] = b"1"
        for pcoll in exits:
            chain.outputs[pcoll] = pcoll
        _LOGGER.debug("%s: one loop over batches", chain.unique_name)
    return rewritten


# ---------------------------------------------------------------------------------------------
# Running a chain


class _Spec(object):
    """What Operation.setup reads: one coder per output (the receivers count and sample)."""
    def __init__(self, output_coders):
        self.output_coders = output_coders


def _create_chain(factory, transform_id, transform_proto, unused_parameter, consumers):
    global built
    built += 1
    part = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(transform_proto.spec.payload)
    tags = list(transform_proto.outputs.keys())
    coders = factory.get_output_coders(transform_proto)
    op = ChainOperation(
        common.NameContext(transform_proto.unique_name, transform_id),
        _Spec([coders[tag] for tag in tags]),
        factory.counter_factory,
        factory.state_sampler)
    bundle_processor.BeamTransformFactory.augment_oldstyle_op(
        op, transform_proto.unique_name, consumers, tags)
    op.plan(factory, part, transform_proto.inputs["in"], tags,
            _BATCH_INPUTS in transform_proto.annotations)
    return op


class ChainOperation(operations.Operation):
    """One operation in Beam's tree running the chain's transforms."""
    def plan(self, factory, part, input_pcoll, exit_tags, batch_inputs):
        self.factory = factory
        self.part = part
        self.input_pcoll = input_pcoll
        self.exit_pcolls = exit_tags  # output i of this operation is PCollection exit_pcolls[i]
        self.nodes = []
        self.pending_values, self.pending_carriers = [], []
        # Inputs held before a batch runs: one at first, then (when they may wait) as many as
        # give a batch of outputs from the first transform (a DoFn that explodes its element
        # runs per element).
        self.batch_inputs = batch_inputs
        self.limit = 1

    def setup(self, data_sampler=None):
        super().setup(data_sampler)
        by_input = {}
        for tid, t in self.part.transforms.items():
            by_input.setdefault(_main_input(t), []).append(tid)
        made = {}

        def consumer_of(pcoll):
            targets = [build(tid) for tid in by_input.get(pcoll, [])]
            if pcoll in self.exit_pcolls:
                targets.append(_Exit(self, self.exit_pcolls.index(pcoll)))
            if not targets:
                return _DROP
            counted = _Counted(pcoll, targets[0] if len(targets) == 1 else _Fanout(targets))
            self.counted.append(counted)
            return counted

        def build(tid):
            if tid not in made:
                t = self.part.transforms[tid]
                node = _NODES[t.spec.urn](self, tid, t)
                made[tid] = node
                node.connect({tag: consumer_of(pcoll) for tag, pcoll in t.outputs.items()})
                self.nodes.append(node)
            return made[tid]

        self.counted = []
        roots = [build(tid) for tid in by_input[self.input_pcoll]]
        self.root = roots[0] if len(roots) == 1 else _Fanout(roots)
        self.nodes.reverse()  # built consumers first: reversed, producers come first
        root_pcolls = {p for r in roots for p in r.transform.outputs.values()}
        self.root_outputs = [c for c in self.counted if c.pcoll in root_pcolls]
        for node in self.nodes:
            node.setup()

    def start(self):
        super().start()
        for node in self.nodes:
            node.start()

    def process(self, wv):
        self.pending_values.append(wv.value)
        self.pending_carriers.append(wv)
        if len(self.pending_values) >= self.limit:
            self._run_pending()

    def _run_pending(self):
        values, carriers = self.pending_values, self.pending_carriers
        self.pending_values, self.pending_carriers = [], []
        before = sum(c.count for c in self.root_outputs)
        self.root.push(values, carriers)
        produced = sum(c.count for c in self.root_outputs) - before
        if self.batch_inputs:
            self.limit = max(1, min(BATCH, BATCH * len(values) // max(produced, 1)))

    def finish(self):
        if self.pending_values:
            self._run_pending()
        for node in self.nodes:
            node.finish()
        super().finish()

    def teardown(self):
        for node in self.nodes:
            node.teardown()
        super().teardown()

    def reset(self):
        super().reset()
        for node in self.nodes:
            node.metrics_container.reset()
        for counted in self.counted:
            counted.count = 0

    def monitoring_infos(self, transform_id, tag_to_pcollection_id):
        infos = self.execution_time_monitoring_infos(transform_id)
        for counted in self.counted:
            info = monitoring_infos.int64_counter(
                monitoring_infos.ELEMENT_COUNT_URN, counted.count, pcollection=counted.pcoll)
            infos[monitoring_infos.to_key(info)] = info
        for i, receiver in enumerate(self.receivers):
            (_, total, count, low, high) = receiver.opcounter.mean_byte_counter.value()
            if count:
                info = monitoring_infos.int64_distribution(
                    monitoring_infos.SAMPLED_BYTE_SIZE_URN,
                    DistributionData(total, count, low, high),
                    pcollection=self.exit_pcolls[i])
                infos[monitoring_infos.to_key(info)] = info
        for node in self.nodes:
            info = monitoring_infos.int64_counter(
                monitoring_infos.PROCESS_BUNDLE_MSECS_URN, node.state.sampled_msecs_int(),
                ptransform=node.transform_id)
            infos[monitoring_infos.to_key(info)] = info
            infos.update(node.metrics_container.to_runner_api_monitoring_infos(node.transform_id))
        return infos



def _tagged(exn, name):
    """The exception as Beam's DoFnRunner re-raises it: its message naming the transform."""
    if getattr(exn, '_tagged_with_step', False):
        return exn
    annotation = " [while running '%s']" % name
    try:
        tagged = type(exn)(exn.args[0] + annotation, *exn.args[1:])
        tagged._tagged_with_step = True
    except Exception:  # pylint: disable=broad-except
        tagged = RuntimeError(
            traceback.format_exception_only(type(exn), exn)[-1].strip() + annotation)
        tagged._tagged_with_step = True
    _LOGGER.exception(tagged)
    return tagged.with_traceback(sys.exc_info()[2])


class _Drop(object):
    def push(self, values, carriers):
        pass


_DROP = _Drop()


class _Counted(object):
    """Counts what passes into a PCollection inside the chain (Beam's element count)."""
    def __init__(self, pcoll, target):
        self.pcoll = pcoll
        self.target = target
        self.count = 0

    def push(self, values, carriers):
        self.count += len(values)
        self.target.push(values, carriers)


class _Fanout(object):
    def __init__(self, targets):
        self.targets = targets

    def push(self, values, carriers):
        for target in self.targets:
            target.push(values, carriers)


class _Exit(object):
    """Hands elements to Beam's receivers of a PCollection that leaves the chain."""
    def __init__(self, op, index):
        self.op = op
        self.index = index

    def push(self, values, carriers):
        receive = self.op.receivers[self.index].receive
        for value, carrier in zip(values, carriers):
            receive(carrier.with_value(value))


class _Node(object):
    """A transform of the chain; carriers are WindowedValues whose timestamp, windows and pane
    the values in the same position have (their own values are not read)."""
    def __init__(self, op, transform_id, transform):
        self.op = op
        self.transform_id = transform_id
        self.transform = transform
        self.name = transform.unique_name
        self.metrics_container = MetricsContainer(transform.unique_name)
        self.state = op.state_sampler.scoped_state(
            common.NameContext(transform.unique_name, transform_id), 'process',
            metrics_container=self.metrics_container)
        self.input_windowing = op.factory.get_input_windowing(transform)

    def connect(self, targets):
        """targets: the consumer of each output tag's PCollection; one output but ParDo's."""
        self.main = next(iter(targets.values()), _DROP)

    def setup(self):
        pass

    def start(self):
        pass

    def finish(self):
        pass

    def teardown(self):
        pass


class _ParDo(_Node):
    def __init__(self, op, transform_id, transform):
        super().__init__(op, transform_id, transform)
        fn, _, _, _, windowing = _simple_pardo(transform)
        self.fn = fn
        self.signature = common.DoFnSignature(fn)
        self.assign = _assigner((windowing or self.input_windowing).windowfn)
        # Beam refuses a str, bytes or dict returned by a DoFn class's process (not Map's).
        self.check_output = not isinstance(fn, core.CallableWrapperDoFn)
        self.kind, self.user_fn = _wrapped(fn)

    def connect(self, targets):
        self.main = targets.get('None', _DROP)
        self.tagged = {tag: t for tag, t in targets.items() if tag != 'None'}

    def setup(self):
        with self.state:
            self.signature.setup_lifecycle_method.method_value()
        self.process = self.signature.process_method.method_value

    def start(self):
        with self.state:
            try:
                started = self.signature.start_bundle_method.method_value()
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)
            if started is not None:
                raise RuntimeError(
                    'Start Bundle should not output any elements but got %s' % started)

    def teardown(self):
        self.signature.teardown_lifecycle_method.method_value()

    def push(self, values, carriers):
        if self.kind == 'map':
            self._map(values, carriers)
        elif self.kind == 'filter':
            self._filter(values, carriers)
        else:
            self._process(values, carriers)

    def _map(self, values, carriers):
        self.by_tag = {}
        with self.state:
            try:
                results = list(map(self.user_fn, values))
                if any(issubclass(t, _SPECIAL) for t in set(map(type, results))):
                    out_values, out_carriers = [], []
                    for result, carrier in zip(results, carriers):
                        if isinstance(result, _SPECIAL):
                            self._special(result, carrier, out_values, out_carriers)
                        else:
                            out_values.append(result)
                            out_carriers.append(carrier)
                    results, carriers = out_values, out_carriers
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)
        self.main.push(results, carriers)
        self._push_tagged()

    def _filter(self, values, carriers):
        with self.state:
            try:
                keep = list(map(self.user_fn, values))
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)
        self.main.push(
            list(itertools.compress(values, keep)), list(itertools.compress(carriers, keep)))

    def _process(self, values, carriers):
        process = self.process
        special = _SPECIAL
        out_values, out_carriers = [], []
        self.by_tag = {}
        with self.state:
            try:
                for value, carrier in zip(values, carriers):
                    results = process(value)
                    if results is None:
                        continue
                    if self.check_output:
                        self.check_output = False
                        if isinstance(results, (str, bytes, dict)):
                            raise TypeError(
                                'Returning a %s from a ParDo or FlatMap is not allowed. '
                                'Please use list(%r) if you really want this behavior.' %
                                (type(results).__name__, results))
                    for result in results:
                        if isinstance(result, special):
                            self._special(result, carrier, out_values, out_carriers)
                        else:
                            out_values.append(result)
                            out_carriers.append(carrier)
                        if len(out_values) >= BATCH:
                            self.main.push(out_values, out_carriers)
                            out_values, out_carriers = [], []
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)
        if out_values:
            self.main.push(out_values, out_carriers)
        self._push_tagged()

    def _push_tagged(self):
        by_tag, self.by_tag = self.by_tag, {}
        for tag, (tag_values, tag_carriers) in by_tag.items():
            self.tagged.get(tag, _DROP).push(tag_values, tag_carriers)

    def _special(self, result, carrier, out_values, out_carriers):
        tag = None
        if isinstance(result, TaggedOutput):
            tag = result.tag
            if not isinstance(tag, str):
                raise TypeError('In %s, tag %s is not a string' % (self.name, tag))
            result = result.value
        if isinstance(result, WindowedValue):
            wv = result
            if len(carrier.windows) != 1:
                wv.windows *= len(carrier.windows)
        elif isinstance(result, window.TimestampedValue):
            micros = result.timestamp.micros
            wv = _create(result.value, micros, self.assign(micros, result.value, None),
                         PANE_INFO_UNKNOWN)
            if len(carrier.windows) != 1:
                wv.windows *= len(carrier.windows)
        else:
            wv = carrier.with_value(result)
        if tag is None:
            out_values.append(wv.value)
            out_carriers.append(wv)
        else:
            tag_values, tag_carriers = self.by_tag.setdefault(tag, ([], []))
            tag_values.append(wv.value)
            tag_carriers.append(wv)
            if len(tag_values) >= BATCH:
                del self.by_tag[tag]
                self.tagged.get(tag, _DROP).push(tag_values, tag_carriers)


class _WindowInto(_Node):
    def __init__(self, op, transform_id, transform):
        super().__init__(op, transform_id, transform)
        strategy = proto_utils.parse_Bytes(
            transform.spec.payload, beam_runner_api_pb2.WindowingStrategy)
        self.assign = _assigner(
            core.Windowing.from_runner_api(strategy, op.factory.context).windowfn)

    def push(self, values, carriers):
        assign = self.assign
        out_values, out_carriers = [], []
        with self.state:
            try:
                for value, carrier in zip(values, carriers):
                    micros = carrier.timestamp_micros
                    for w in carrier.windows:
                        out_values.append(value)
                        out_carriers.append(
                            _create(value, micros, assign(micros, value, w), PANE_INFO_UNKNOWN))
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)
        self.main.push(out_values, out_carriers)


def _assigner(window_fn):
    """The windows of an element at a timestamp (in microseconds), as window_fn assigns them;
    FixedWindows and GlobalWindows computed on integers, their windows made once."""
    if type(window_fn) is window.GlobalWindows:
        return lambda micros, value, w: _GLOBAL
    if type(window_fn) is window.FixedWindows:
        size, offset, made = window_fn.size.micros, window_fn.offset.micros, {}
        slow = _assigner_of(window_fn)

        def fixed(micros, value, w):
            start = micros - (micros - offset) % size
            windows = made.get(start)
            if windows is None:
                windows = tuple(slow(micros, value, w))
                if len(made) < 100_000:
                    made[start] = windows
            return windows

        return fixed
    return _assigner_of(window_fn)


def _assigner_of(window_fn):
    assign, context = window_fn.assign, window.WindowFn.AssignContext

    def any_fn(micros, value, w):
        return assign(context(Timestamp(micros=micros), element=value, window=w))

    return any_fn


class _Precombine(_Node):
    """Beam's PGBKCVOperation: accumulators per key (and window) for the bundle, the oldest
    tenth let go when the table holds too many keys."""
    def __init__(self, op, transform_id, transform):
        super().__init__(op, transform_id, transform)
        payload = proto_utils.parse_Bytes(transform.spec.payload, beam_runner_api_pb2.CombinePayload)
        fn = core.CombineFn.from_runner_api(payload.combine_fn, op.factory.context)
        self.combine_fn = combiners.curry_combine_fn(fn, [], {})
        self.compact = (None if self.combine_fn.compact.__func__ is core.CombineFn.compact else
                        self.combine_fn.compact)
        windowing = self.input_windowing
        self.is_default_windowing = windowing.is_default()
        tsc_type = windowing.timestamp_combiner
        self.timestamp_combiner = (
            None if tsc_type == window.TimestampCombiner.OUTPUT_AT_EOW else
            window.TimestampCombiner.get_impl(tsc_type, windowing.windowfn))
        self.max_keys = (
            1000 * 1000 if isinstance(fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or
            (isinstance(fn, core.CallableWrapperCombineFn) and fn._fn in (min, max, sum)) else
            100 * 1000)
        self.table = {}

    def setup(self):
        self.combine_fn.setup()

    def teardown(self):
        self.combine_fn.teardown()

    def push(self, values, carriers):
        table = self.table
        add_input = self.combine_fn.add_input
        create = self.combine_fn.create_accumulator
        with self.state:
            try:
                if self.is_default_windowing:
                    for (key, value) in values:
                        entry = table.get(key)
                        if entry is None:
                            entry = self._new_entry(key, create(), None)
                        entry[0] = add_input(entry[0], value)
                else:
                    combiner = self.timestamp_combiner
                    for (key, value), carrier in zip(values, carriers):
                        timestamp = carrier.timestamp if combiner else None
                        for w in carrier.windows:
                            wkey = (w, key)
                            entry = table.get(wkey)
                            if entry is None:
                                entry = self._new_entry(wkey, create(), timestamp)
                            entry[0] = add_input(entry[0], value)
                            if combiner:
                                entry[1] = combiner.combine(entry[1], timestamp)
            except Exception as exn:  # pylint: disable=broad-except
                raise _tagged(exn, self.name)

    def _new_entry(self, wkey, accumulator, timestamp):
        table = self.table
        if len(table) >= self.max_keys:
            target = len(table) * 9 // 10
            let_go = []
            for old_wkey, old in table.items():
                let_go.append((old_wkey, old))
                if len(table) - len(let_go) <= target:
                    break
            for old_wkey, _ in let_go:
                del table[old_wkey]
            self._output(let_go)
        entry = table[wkey] = [accumulator, timestamp]
        return entry

    def finish(self):
        entries, self.table = list(self.table.items()), {}
        with self.state:
            self._output(entries)

    def _output(self, entries):
        values, carriers = [], []
        for wkey, (accumulator, timestamp) in entries:
            value = accumulator if self.compact is None else self.compact(accumulator)
            if self.is_default_windowing:
                kv = (wkey, value)
                values.append(kv)
                carriers.append(_create(kv, _MIN_MICROS, _GLOBAL, PANE_INFO_UNKNOWN))
            else:
                w, key = wkey
                kv = (key, value)
                if self.timestamp_combiner is None:
                    timestamp = w.max_timestamp()
                values.append(kv)
                carriers.append(WindowedValue(kv, timestamp, (w, )))
            if len(values) >= BATCH:
                self.main.push(values, carriers)
                values, carriers = [], []
        if values:
            self.main.push(values, carriers)


_NODES = {_PAR_DO: _ParDo, _WINDOW_INTO: _WindowInto, _PRECOMBINE: _Precombine}
