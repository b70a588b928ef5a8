"""A segment tree of free CPU and RAM over a pool's node positions.

The packing index (:mod:`.packindex`) keeps the nodes whose GPUs are all taken in one, so a
CPU-only request finds the first of them with room without a pass over them.
"""

from __future__ import annotations


class RoomTree:
    """Positions with free CPU and RAM: the first one with room for a request, in log time
    when few are short of one resource but not the other.

    A segment tree over the pool's node positions whose inner entries hold the most free
    CPU and the most free RAM below them (-1: no node there).
    """

    def __init__(self, n: int) -> None:
        size = 1
        while size < n:
            size *= 2
        self.size = size
        self.cpu = [-1] * (2 * size)
        self.mem = [-1] * (2 * size)

    def set(self, pos: int, cpu: int, mem: int) -> None:
        cpus, mems = self.cpu, self.mem
        i = pos + self.size
        cpus[i], mems[i] = cpu, mem
        i >>= 1
        while i:
            a, b = 2 * i, 2 * i + 1
            c = cpus[a] if cpus[a] > cpus[b] else cpus[b]
            m = mems[a] if mems[a] > mems[b] else mems[b]
            if cpus[i] == c and mems[i] == m:
                break  # nothing above changes
            cpus[i], mems[i] = c, m
            i >>= 1

    def clear(self, pos: int) -> None:
        if self.cpu[pos + self.size] >= 0:
            self.set(pos, -1, -1)

    def first(self, cpu: int, mem: int) -> int | None:
        """The lowest position with at least ``cpu`` free CPU and ``mem`` free RAM."""
        cpus, mems, size = self.cpu, self.mem, self.size
        if cpus[1] < cpu or mems[1] < mem:
            return None
        stack = [1]
        while stack:
            i = stack.pop()
            if cpus[i] < cpu or mems[i] < mem:
                continue
            if i >= size:
                return i - size
            stack.append(2 * i + 1)
            stack.append(2 * i)
        return None
