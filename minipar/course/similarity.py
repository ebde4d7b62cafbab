"""How alike two submissions are, for the instructor (never a grade): winnowed fingerprints.

MOSS's method (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003): a file becomes its tokens with every name and number replaced
by a placeholder (renaming a variable changes nothing), the tokens' k-grams are hashed, and in
every window of w consecutive hashes the smallest is kept. Two files share a fingerprint where
they share a run of at least k tokens; any shared run of k + w - 1 tokens is always caught.

    prints = fingerprints(code, given)      # given: the hand-out's stub (not the student's work)
    share = overlap(prints_a, prints_b)     # |A & B| / min(|A|, |B|), 0..1

Only what the student wrote is compared: the stub's lines are taken out first.
"""

from __future__ import annotations

import hashlib
import io
import keyword
import tokenize

K = 12  # tokens a fingerprint covers: a shared statement or two, not a shared `for i in range(`
W = 8  # the window: any shared run of K + W - 1 = 19 tokens is found


def tokens(code: str) -> list[str]:
    """The code's tokens, names and numbers as placeholders, comments and layout dropped."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.NAME:
                out.append(tok.string if keyword.iskeyword(tok.string) else "N")
            elif tok.type == tokenize.NUMBER:
                out.append("0")
            elif tok.type in (tokenize.OP, tokenize.STRING):
                out.append(tok.string if tok.type == tokenize.OP else "S")
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a file that does not tokenize to the end: what came before still counts
    return out


def written(code: str, given: str = "") -> str:
    """The lines of `code` that are not the stub's (what the student wrote)."""
    stub = {line.strip() for line in given.splitlines()}
    return "\n".join(line for line in code.splitlines() if line.strip() not in stub)


def fingerprints(code: str, given: str = "") -> set[int]:
    """The winnowed hashes of what the student wrote in `code`."""
    toks = tokens(written(code, given))
    grams = [" ".join(toks[i : i + K]) for i in range(len(toks) - K + 1)]
    hashes = [int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big")
              for g in grams]  # fmt: skip
    if len(hashes) <= W:
        return set(hashes)
    return {min(hashes[i : i + W]) for i in range(len(hashes) - W + 1)}


def overlap(a: set[int], b: set[int]) -> float:
    """The share of the smaller one's fingerprints the other has too (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))


def report(sources: dict[str, dict[str, str]], references: dict[str, dict[str, str]],
           given: dict[str, str], least: float = 0.5) -> list[tuple]:  # fmt: skip
    """Every pair at or above `least`, most alike first: (share, exercise, who, whom), where
    `sources` is {student: {exercise: code}} and `references` {name: {exercise: code}} (the
    worked answers, the library's answers), compared with every student but not each other."""
    prints = {
        (who, ex): fingerprints(code, given.get(ex, ""))
        for group in (sources, references)
        for who, files in group.items()
        for ex, code in files.items()
    }
    students = sorted(sources)
    pairs = []
    for i, a in enumerate(students):
        others = students[i + 1 :] + sorted(references)
        for b in others:
            for ex in sources[a]:
                if (b, ex) in prints:
                    share = overlap(prints[(a, ex)], prints[(b, ex)])
                    if share >= least:
                        pairs.append((round(share, 3), ex, a, b))
    return sorted(pairs, key=lambda p: (-p[0], p[1], p[2], p[3]))
