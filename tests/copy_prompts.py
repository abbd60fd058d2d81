"""Prompts that copy their own text (edit loops) beside novel ones, for suffix decoding and
the hybrid proposer: a short code snippet, a request to revise it, the code again."""

from __future__ import annotations

SNIPPET = '''def merge(a, b):
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
'''


def prompts(tokenizer) -> list[list[int]]:
    """Edit-loop prompts (the code, a request to revise it, the code again half way), and
    two novel ones."""
    texts = [SNIPPET + "\n# rename out to result:\n" + SNIPPET[:120],
             "# tests\n" + SNIPPET + "\n\n" + SNIPPET[:60],
             "def fibonacci(n):", "import os\nimport sys\n"]
    return [tokenizer.encode(t) for t in texts]
