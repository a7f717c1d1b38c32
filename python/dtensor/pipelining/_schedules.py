"""Pipeline schedules with torch.distributed.pipelining's names: the order in which each rank runs
its stages' forwards and backwards over the microbatches.

NOTE [pipeline schedules]: a schedule is, per rank, a list of actions (stage, F | B | I | W,
microbatch), run in order. F is a forward, B a whole backward, I and W its two halves (the
inputs' gradients, sent on at once, and the weights' gradients, deferred: the zero-bubble split).
Every stage runs its forwards, and its backwards, in microbatch order, so each boundary's
activations and gradients arrive in the order they are awaited (NOTE [pipeline transfers]); the
lists below are PyTorch's and Megatron's orders.
"""

import time

import torch

from dtensor.pipelining._microbatch import merge_chunks, split_args_kwargs_into_chunks

F, B, I, W = "F", "B", "I", "W"


class _PipelineSchedule:
    def __init__(self, stages, n_microbatches, loss_fn=None, scale_grads=True):
        if n_microbatches < 1:
            raise ValueError("a schedule needs at least one microbatch")
        self._stages = list(stages)
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self._scale_grads = scale_grads
        self.timeline = []  # (stage, action, microbatch, start, end) of the last step

    # The actions of this rank, in order, for a training step.
    def _actions(self):
        raise NotImplementedError

    def _run(self, actions, args, kwargs, target, losses, train):
        n = self._n_microbatches
        by_index = {s.stage_index: s for s in self._stages}
        first = next((s for s in self._stages if s.is_first), None)
        last = next((s for s in self._stages if s.is_last), None)
        args_split = kwargs_split = None
        if first is not None:
            args_split, kwargs_split = split_args_kwargs_into_chunks(args, kwargs, n)
        targets = None
        if last is not None and target is not None:
            targets, _ = split_args_kwargs_into_chunks((target,), {}, n)
        last_b = {}  # stage -> its last backward action's microbatch (FSDP's gradient sync)
        for stage, kind, mb in actions:
            if kind in (B, W):
                last_b[stage] = mb
        local = {}
        for st in self._stages:
            st.output_chunks.clear()
            st.losses.clear()
            st._start_step(n, local)
        self.timeline = []
        for stage, kind, mb in actions:
            st = by_index[stage]
            t0 = time.perf_counter()
            if kind == F:
                out = st.forward_one_chunk(mb, args_split[mb] if st.is_first else (),
                                           kwargs_split[mb] if st.is_first else None, train)
                if st.is_last:
                    st.output_chunks[mb] = out
                    if self._loss_fn is not None and targets is not None:
                        with torch.set_grad_enabled(train):
                            st.losses[mb] = self._loss_fn(out, targets[mb][0])
            elif kind == B:
                st.backward_one_chunk(mb, st.losses.get(mb), last_backward=last_b[stage] == mb)
            elif kind == I:
                st.backward_input(mb, st.losses.get(mb))
            else:
                st.backward_weight(mb, last_backward=last_b[stage] == mb)
            self.timeline.append((stage, kind, mb, t0, time.perf_counter()))
        for st in self._stages:
            st._finish_step()
            if train and self._scale_grads:
                st.scale_grads(n)
        if last is None:
            return None
        if losses is not None and last.losses:
            losses.extend(last.losses[i].detach() for i in range(n))
        return merge_chunks([last.output_chunks[i] for i in range(n)])

    def step(self, *args, target=None, losses=None, **kwargs):
        """One training step over the whole batch ``args`` (split into microbatches on the first
        stage; the other stages pass nothing): forwards, the loss on the last stage against
        ``target``, backwards; gradients accumulate over the microbatches (divided by their
        count when scale_grads). Returns the last stage's merged output (None elsewhere);
        ``losses`` receives each microbatch's loss there."""
        return self._run(self._actions(), args, kwargs, target, losses, train=True)

    def eval(self, *args, target=None, losses=None, **kwargs):
        """Forwards only (no autograd), microbatch by microbatch; the loss too when a target is
        given."""
        n = self._n_microbatches
        actions = [(s.stage_index, F, mb) for s in self._stages for mb in range(n)]
        with torch.no_grad():
            return self._run(actions, args, kwargs, target, losses, train=False)


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule of one stage per rank."""

    def __init__(self, stage, n_microbatches, loss_fn=None, scale_grads=True, **_):
        super().__init__([stage], n_microbatches, loss_fn, scale_grads)
        self._stage = stage


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank (stage k on pipeline rank k mod group size)."""

    def __init__(self, stages, n_microbatches, loss_fn=None, scale_grads=True, **_):
        super().__init__(sorted(stages, key=lambda s: s.stage_index), n_microbatches, loss_fn,
                         scale_grads)
        self.pp_group_size = stages[0].group_size
        self.rank = stages[0].group_rank


class ScheduleGPipe(PipelineScheduleSingle):
    """Every microbatch's forward, then every backward."""

    def _actions(self):
        s, n = self._stage.stage_index, self._n_microbatches
        return [(s, F, mb) for mb in range(n)] + [(s, B, mb) for mb in range(n)]


class Schedule1F1B(PipelineScheduleSingle):
    """Warm-up forwards (as many as stages after this one), then one forward and one backward in
    turn, then the remaining backwards: at most num_stages - stage activations held."""

    def _actions(self):
        st, n = self._stage, self._n_microbatches
        s = st.stage_index
        warmup = min(n, st.num_stages - s - 1)
        out = [(s, F, mb) for mb in range(warmup)]
        for i in range(n - warmup):
            out += [(s, F, warmup + i), (s, B, i)]
        out += [(s, B, mb) for mb in range(n - warmup, n)]
        return out


class ScheduleLoopedBFS(PipelineScheduleMulti):
    """Several stages per rank, breadth first: every microbatch through this rank's first stage,
    then its next; backwards in the reverse stage order."""

    def _actions(self):
        n = self._n_microbatches
        out = [(s.stage_index, F, mb) for s in self._stages for mb in range(n)]
        out += [(s.stage_index, B, mb) for s in reversed(self._stages) for mb in range(n)]
        return out


def _interleaved_orders(stages, n, group_size, rank):
    """Megatron's interleaved order: microbatches in rounds of group_size through each local
    stage in turn; backwards through the local stages in reverse."""
    if n % group_size != 0:
        raise ValueError(f"the interleaved schedules need the microbatches ({n}) to be a multiple "
                         f"of the pipeline group size ({group_size})")
    idx = [s.stage_index for s in stages]
    fwd, bwd = [], []
    for r0 in range(0, n, group_size):
        for s in idx:
            fwd += [(s, mb) for mb in range(r0, r0 + group_size)]
        for s in reversed(idx):
            bwd += [(s, mb) for mb in range(r0, r0 + group_size)]
    warmup = min(len(fwd), (len(idx) - 1) * group_size + 2 * (group_size - rank - 1))
    return fwd, bwd, warmup


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Several stages per rank, 1F1B across them (Megatron's interleaved schedule): a smaller
    bubble than 1F1B by the number of stages per rank."""

    def _actions(self):
        fwd, bwd, warmup = _interleaved_orders(self._stages, self._n_microbatches,
                                               self.pp_group_size, self.rank)
        out = [(s, F, mb) for s, mb in fwd[:warmup]]
        for i, (s, mb) in enumerate(fwd[warmup:]):
            out.append((s, F, mb))
            out.append((bwd[i][0], B, bwd[i][1]))
        out += [(s, B, mb) for s, mb in bwd[len(fwd) - warmup:]]
        return out


class ScheduleInterleavedZeroBubble(PipelineScheduleMulti):
    """The interleaved order with each backward split (zero bubble, ZB-H1): the inputs' gradient
    (I) goes to the previous stage at once, and the weights' gradient (W) is deferred by as many
    steps as the rank would otherwise wait, filling the cool-down bubble. fully_shard'ed stages
    reduce their gradients once, at the last weight pass (NOTE [zero bubble with FSDP])."""

    def _actions(self):
        fwd, bwd, warmup = _interleaved_orders(self._stages, self._n_microbatches,
                                               self.pp_group_size, self.rank)
        lag = self.pp_group_size - self.rank - 1
        out, pending = [], []

        def backward(s, mb):
            out.append((s, I, mb))
            pending.append((s, mb))
            if len(pending) > lag:
                ws, wmb = pending.pop(0)
                out.append((ws, W, wmb))

        out += [(s, F, mb) for s, mb in fwd[:warmup]]
        for i, (s, mb) in enumerate(fwd[warmup:]):
            out.append((s, F, mb))
            backward(*bwd[i])
        for s, mb in bwd[len(fwd) - warmup:]:
            backward(s, mb)
        out += [(s, W, mb) for s, mb in pending]
        return out
