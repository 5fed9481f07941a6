"""Could a weight layout permuted at load make nvfp4_m1's "shift" decode cheaper? A search, no GPU.

    python bench/fp4_bit_tiling.py

The decode turns a 32-bit word of 8 e2m1 codes into 4 bf16 pairs; a pair wants one code's sign at bit 15 and its 3
magnitude bits at 6-8, the other's at 31 and 22-24 (T = {6, 7, 8, 15, 22, 23, 24, 31}). Today each pair costs two
shifts and two masks (decode_fp4_shift). If the codes' bits were stored so that every pair were one shift of the
word, each would cost one shift and one mask: the 32 bits would have to split into 4 translates of T. The search
prints whether any such split exists (also for 64-128 bits, each pair then a funnel shift of a window), and, for the
best three translates, how many distinct shifts the remaining pair needs.
"""

from __future__ import annotations

import itertools

T = (6, 7, 8, 15, 22, 23, 24, 31)


def tilings(bits: int) -> list[list[int]]:
    """Every split of range(bits) into translates of T (offsets from T's lowest bit), by exact cover."""
    base = [t - T[0] for t in T]
    found: list[list[int]] = []

    def cover(covered: int, chosen: list[int]) -> None:
        if covered == (1 << bits) - 1:
            found.append(list(chosen))
            return
        low = (~covered & (covered + 1)).bit_length() - 1  # the lowest bit not yet covered: a translate starts there
        mask = sum(1 << (low + b) for b in base)
        if low + base[-1] < bits and not covered & mask:
            chosen.append(low)
            cover(covered | mask, chosen)
            chosen.pop()
    cover(0, [])
    return found


def fewest_shifts_for_the_rest() -> tuple[int, tuple, list[int], tuple]:
    """Three disjoint translates of T in 32 bits, and the fewest distinct shifts that move the 8 bits left onto T."""
    offsets = {d: frozenset(t + d for t in T) for d in range(-31, 32) if all(0 <= t + d <= 31 for t in T)}
    best = None
    for combo in itertools.combinations(offsets, 3):
        sets = [offsets[d] for d in combo]
        if any(a & b for a, b in itertools.combinations(sets, 2)):
            continue
        rest = sorted(set(range(32)) - set().union(*sets))
        shifts = sorted({s - t for s in rest for t in T})
        for n in range(1, 9):
            if best is not None and n >= best[0]:
                break
            hit = next((d for d in itertools.combinations(shifts, n) if _matches(rest, set(d))), None)
            if hit is not None:
                best = (n, combo, rest, hit)
                break
    return best


def _matches(rest: list[int], shifts: set[int]) -> bool:
    """Whether every bit of `rest` can go to its own bit of T by one of the shifts (bipartite matching)."""
    owner: dict[int, int] = {}

    def place(s: int, seen: set[int]) -> bool:
        for t in T:
            if (s - t) in shifts and t not in seen:
                seen.add(t)
                if t not in owner or place(owner[t], seen):
                    owner[t] = s
                    return True
        return False
    return all(place(s, set()) for s in rest)


def main() -> None:
    for bits in (32, 64, 96, 128):
        print(f"{bits} bits split into {bits // 8} translates of T: {tilings(bits) or 'none'}")
    n, combo, rest, shifts = fewest_shifts_for_the_rest()
    # ALU pipe: a mask (LOP3) per piece and a right shift (SHF) per positive offset; left shifts go as multiplies
    # (IMAD, the FMA pipe), as in decode_fp4_shift, whose 4 pairs cost 8 masks and 2 right shifts
    alu = 3 + n + sum(d > 0 for d in combo + shifts)
    print(f"best: three pairs as one shift of the word each (offsets {combo}; source bit = target + offset), the "
          f"last pair's bits {rest} need {n} shifts {shifts}: {alu} ALU operations a word against the shift "
          f"decode's 10")


if __name__ == "__main__":
    main()
