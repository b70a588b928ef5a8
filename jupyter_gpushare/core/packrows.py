"""The used nodes of one packing pool as rows, by position, GPU room and free CPU.

A :class:`RowTable` holds, for each used node of a pool (some grant on it, CPU or GPU
left, not cordoned), the row tuple the scoring loop of :mod:`.packindex` reads, and finds
the rows a request is worth scoring against without a pass over the others: by the
bucket of the node's largest free GPU, by the step of its free CPU, in position order
(the ranking's last tie-break), and the first node with every GPU taken that has room
for a CPU-only request (a :class:`.roomtree.RoomTree`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .model import UNIT
from .roomtree import RoomTree
from .state import NodeState


@dataclass
class NodeView:
    """What packing needs to know about one node, refreshed when its grants change."""

    ns: NodeState
    pos: int  # place in the pool's node list: the final tie-break
    kind: tuple
    model: str
    units: list[int] = field(default_factory=list)  # free milli per GPU, by GPU index
    sorted_units: tuple[int, ...] = ()
    pristine: bool = False  # nothing granted on it: interchangeable with its kind
    in_heap: bool = False
    sig: int = 0  # interned (model, sorted_units): with the CPU levels, a memo key of its state
    total: int = 0  # free milli over all GPUs
    inv_cpu: float = 0.0  # 1 / CPU capacity
    inv_gpu: float = 0.0  # 1 / GPU capacity in milli
    head: tuple | None = None  # its row while untouched (kept: a head is scored each decision)


Row = tuple[int, int, tuple[int, ...], str, int, int, float, float, int, NodeView]
"""(free CPU, free RAM, sorted free units, model, signature, total free, 1/CPU capacity,
1/GPU capacity, position, view) of one node: what the scoring loop reads."""

BUCKET = 100
"""Width (milli) of the capacity buckets of used nodes."""

CPU_STEPS = (
    1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 8000, 10000, 12000, 16000, 20000,
    24000, 32000, 40000, 48000, 64000, 96000,
)  # fmt: skip
"""Free CPU (milli) by which rows are grouped, so a scan reads only those with about enough."""


def row_of(view: NodeView) -> Row:
    """The row of a node as it stands."""
    ns = view.ns
    return (
        ns.free_cpu, ns.free_mem, view.sorted_units, view.model, view.sig, view.total,
        view.inv_cpu, view.inv_gpu, view.pos, view,
    )  # fmt: skip


def head_row(view: NodeView) -> Row:
    """The row of an untouched node, made once (its values do not change until it is used,
    or its signature is made again: :meth:`.packindex.PoolIndex.refresh` then drops it)."""
    row = view.head
    if row is None:
        row = view.head = row_of(view)
    return row


def _position(row: Row) -> int:
    return row[8]


class RowTable:
    """The rows of a pool's used nodes, found by GPU room, free CPU and position.

    Each row sits in the bucket of its node's largest free GPU (``BUCKET`` milli wide); a
    bucket's positions are the bits set in its entry of ``bits``, and ``cpu_bits[k]`` has
    the positions of the rows with at least ``CPU_STEPS[k]`` free CPU, so the rows worth
    scoring come out of a few big-integer operations, in position order. Bucket 0 is
    split again: nodes with every GPU taken (in a segment tree of free CPU and RAM: the
    first one with room wins a CPU-only request) and those with slivers of GPU left.
    """

    def __init__(self, n: int) -> None:
        self.row_at: list[Row | None] = [None] * n
        self.bucket_of: list[int] = [-1] * n  # -1: not filed
        self.bits: list[int] = [0] * (UNIT // BUCKET + 1)
        self.cpu_bits: list[int] = [0] * len(CPU_STEPS)
        self.cpu_rank: list[int] = [0] * n  # how many CPU steps a filed row's free CPU reaches
        self.full = RoomTree(n)
        self.slivers: dict[int, Row] = {}
        self.sliver_room = RoomTree(n)  # the slivers' free CPU and RAM: has any room?

    def unfile(self, pos: int) -> None:
        """Take a row out of its bucket (it keeps its CPU step until :meth:`set_cpu`)."""
        old = self.bucket_of[pos]
        if old >= 0:
            self.bucket_of[pos] = -1
            self.row_at[pos] = None
            self.bits[old] &= ~(1 << pos)
            if old == 0:
                self.full.clear(pos)
                if self.slivers.pop(pos, None) is not None:
                    self.sliver_room.clear(pos)

    def file(self, view: NodeView) -> None:
        """Put a used node's row into the bucket of its largest free GPU."""
        units = view.sorted_units
        top = units[-1] if units else 0
        b = min(top, UNIT) // BUCKET
        pos = view.pos
        row = self.row_at[pos] = row_of(view)
        if self.bucket_of[pos] != b:  # (re-filed in place when signatures are made again)
            self.bits[b] |= 1 << pos
            self.bucket_of[pos] = b
        if b == 0:
            if view.total:
                self.slivers[pos] = row
                self.sliver_room.set(pos, view.ns.free_cpu, view.ns.free_mem)
            else:
                self.full.set(pos, view.ns.free_cpu, view.ns.free_mem)

    def set_cpu(self, pos: int, free_cpu: int) -> None:
        """File a position under the CPU steps its free CPU reaches (none when not filed)."""
        rank = bisect_right(CPU_STEPS, free_cpu) if self.bucket_of[pos] >= 0 else 0
        old = self.cpu_rank[pos]
        if rank != old:
            bit, cpu_bits = 1 << pos, self.cpu_bits
            for k in range(rank, old):
                cpu_bits[k] &= ~bit
            for k in range(old, rank):
                cpu_bits[k] |= bit
            self.cpu_rank[pos] = rank

    def cpu_rows(self, cpu: int, mem: int) -> Iterable[Row]:
        """The rows a CPU-only request is scored against first, in position order.

        It goes to the first used node whose GPUs are all taken that has room (it costs
        no fragmentation there, the least any node can cost), else it is scored against
        the used nodes with at most slivers of GPU left (``BUCKET``), and only when none
        of those has room against every node.
        """
        pos = self.full.first(cpu, mem)
        if pos is not None:
            row = self.row_at[pos]
            assert row is not None  # (a full node with room is filed)
            return [row]
        if self.sliver_room.first(cpu, mem) is None:
            return []  # (late in a full cluster, thousands of slivers and none with room)
        low = [row for row in self.slivers.values() if row[0] >= cpu and row[1] >= mem]
        low.sort(key=_position)
        return low

    def rows_for(
        self, milli: int, cpu: int, heads: list[NodeView], lo: int = 0, hi: int = -1
    ) -> Iterator[Row]:
        """The rows worth scoring for a request needing ``milli`` on its GPUs and ``cpu``, in
        position order: used nodes in a bucket big enough and with about enough free CPU
        (at least the ``CPU_STEPS`` step below ``cpu``), and ``heads`` (untouched nodes,
        which are not filed); only positions from ``lo`` and below ``hi`` (-1: no end)."""
        bits = 0
        for bucket in self.bits[min(milli, UNIT) // BUCKET :]:
            bits |= bucket
        step = bisect_right(CPU_STEPS, cpu)
        if step:
            bits &= self.cpu_bits[step - 1]
        at = {v.pos: v for v in heads}
        for pos in at:
            bits |= 1 << pos
        if hi >= 0:
            bits &= (1 << hi) - 1
        if lo:
            bits &= ~((1 << lo) - 1)
        flags = bin(bits)[:1:-1]  # flags[pos] == "1": a row to read
        row_at = self.row_at
        pos = flags.find("1")
        while pos >= 0:
            row = row_at[pos]
            yield row if row is not None else head_row(at[pos])
            pos = flags.find("1", pos + 1)

    def changed_rows(self, changed: Iterable[int], milli: int) -> list[Row]:
        """The rows of the ``changed`` positions in a bucket big enough for ``milli``."""
        low = min(milli, UNIT) // BUCKET
        bucket_of, row_at = self.bucket_of, self.row_at
        rows = []
        for pos in changed:
            row = row_at[pos]
            if row is not None and bucket_of[pos] >= low:
                rows.append(row)
        return rows
