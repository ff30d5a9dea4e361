"""Which rank owns which network: contiguous ranges (the default) or a given assignment."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class Ownership:
    """`owner[i]` is the rank of network i; a rank's networks are its local ids 0.. in ascending global id."""
    owner: tuple[int, ...]
    world_size: int

    @classmethod
    def contiguous(cls, n_networks: int, world_size: int) -> "Ownership":
        """Ranges as even as possible: the first n % world ranks hold one network more."""
        if n_networks < world_size:
            raise ConfigError(f"n_networks={n_networks} is smaller than the world size {world_size}: every rank must "
                              "own at least one network; allowed: n_networks >= world size")
        base, extra = divmod(n_networks, world_size)
        owner = []
        for r in range(world_size):
            owner += [r] * (base + (r < extra))
        return cls(tuple(owner), world_size)

    @classmethod
    def from_assignment(cls, assignment, n_networks: int, world_size: int) -> "Ownership":
        values = assignment.tolist() if isinstance(assignment, torch.Tensor) else list(assignment)
        if len(values) != n_networks:
            raise ConfigError(f"assignment has {len(values)} entries; expected one rank per network "
                              f"(n_networks={n_networks})")
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < world_size]
        if bad:
            raise ConfigError(f"assignment contains {bad[0]!r}; allowed: ranks 0..{world_size - 1}")
        empty = sorted(set(range(world_size)) - set(values))
        if empty:
            raise ConfigError(f"assignment gives ranks {empty} no network; every rank must own at least one")
        return cls(tuple(values), world_size)

    @property
    def n_networks(self) -> int:
        return len(self.owner)

    def owned(self, rank: int) -> list[int]:
        """Global ids of `rank`'s networks, ascending (local id = position in this list)."""
        return [i for i, r in enumerate(self.owner) if r == rank]

    def ranges(self) -> list[list[int]] | None:
        """[start, end) per rank when every rank owns one contiguous range in rank order, else None."""
        out, start = [], 0
        for r in range(self.world_size):
            n = sum(1 for o in self.owner if o == r)
            if any(o != r for o in self.owner[start:start + n]):
                return None
            out.append([start, start + n])
            start += n
        return out

    def describe(self) -> dict:
        """JSON form for manifests and the cross-rank comparison."""
        ranges = self.ranges()
        return {"world_size": self.world_size, "ranges": ranges} if ranges is not None else \
            {"world_size": self.world_size, "assignment": list(self.owner)}

    @classmethod
    def from_description(cls, d: dict) -> "Ownership":
        if "ranges" in d:
            owner = []
            for r, (start, end) in enumerate(d["ranges"]):
                owner += [r] * (end - start)
            return cls(tuple(owner), d["world_size"])
        return cls(tuple(d["assignment"]), d["world_size"])

    def tables(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner rank, local id) of every global id, int32 on `device`: the routing lookups."""
        owner = torch.tensor(self.owner, dtype=torch.int32)
        local = torch.empty_like(owner)
        for r in range(self.world_size):
            mask = owner == r
            local[mask] = torch.arange(int(mask.sum()), dtype=torch.int32)
        return owner.to(device), local.to(device)
