"""Rebuild the RAG sample data in ``data/rag/`` from the Python Language Reference.

The documents are sections of the Python documentation as CPython ships them for ``help()``
(``pydoc_data.topics``): written by the CPython developers, under the Python Software Foundation
License. One document per topic, the topic's heading as title; topics longer than ``MAX_WORDS``
words (the whole compound-statement chapter, the type hierarchy, ...) are left out, except for
``try`` and ``import``, and so are topics whose text is repeated inside another one. The
"-[ Footnotes ]-" part of a topic is dropped: pydoc copies a whole chapter's footnotes into
each of its topics, mostly about other sections.

The questions were written by hand for this sample. Each names the one document that answers it
and an ``evidence`` span: words copied from that document that hold the answer (compared with
runs of whitespace collapsed). A passage answers a question when it contains the evidence; this
script checks that each evidence occurs in exactly one document, and records the first passage
that contains it under the default chunking (``answer_passage_id``).

    python tools/make_rag_data.py [OUT_DIR]

Writes ``corpus.parquet`` (``id``, ``title``, ``text``) and ``questions.parquet`` (``id``,
``question``, ``answer_doc_id``, ``evidence``, ``answer_passage_id``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydoc_data.topics import topics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.rag.corpus import make_passages  # noqa: E402

MAX_WORDS = 1000
ALSO = {"try", "import"}
SKIP = {"else"}  # the same text as "if", under a less telling name
# The Retriever's defaults; answer_passage_id is computed for these.
CHUNK_SIZE, OVERLAP = 128, 32

# (question, answer topic, evidence copied from that topic)
QUESTIONS = [
    ("What code does Python generate for an assert statement when it runs with the -O option?",
     "assert", "emits no code for an assert statement when optimization is requested"),
    ("How does Python rewrite an attribute name like __spam that is used inside a class called Ham?",
     "atom-identifiers", 'will be transformed to "_Ham__spam"'),
    ("In the statement x += 1, how many times is x evaluated?",
     "augassign", 'In the augmented version, "x" is only evaluated once.'),
    ("What sign does the result of the % operator take?",
     "binary", "always yields a result with the same sign as its second operand"),
    ("Why does 10**-2 give a float when both operands are integers?",
     "power", "all arguments are converted to float and a float result is delivered"),
    ("What does the expression x or y evaluate to?",
     "booleans", 'The expression "x or y" first evaluates *x*; if *x* is true, its value is returned'),
    ("After leaving a for loop with break, what value does the loop variable have?",
     "break", "the loop control target keeps its current value"),
    ("Are variables assigned in a class body shared between the instances of the class?",
     "class", "Variables defined in the class definition are class attributes; they are shared by instances."),
    ("Should an __exit__ method re-raise the exception that was passed to it?",
     "context-managers", "methods should not reraise the passed-in exception"),
    ("In a dict comprehension, is the key or the value evaluated first?",
     "dict", "Starting with 3.8, the key is evaluated before the value"),
    ("Are free variables looked up when the code is compiled or when it runs?",
     "dynamic-features", "Name resolution of free variables occurs at runtime, not at compile time."),
    ("Which unhandled exception ends a program without printing a traceback?",
     "exceptions", 'it prints a stack traceback, except when the exception is "SystemExit"'),
    ("How do you write a tuple that has only one element?",
     "exprlists", "The trailing comma is required only to create a single tuple"),
    ("Is a float literal with leading zeros such as 077e010 allowed?",
     "floating", '"077e010" is legal, and denotes the same number as "77e10"'),
    ("Why can a list used as a default argument value keep items from earlier calls?",
     "function", "Default parameter values are evaluated from left to right when the function definition is executed."),
    ("What does a / in a function's parameter list mean?",
     "function", "positional-only parameters and may only be passed by positional arguments"),
    ("Can a name be used earlier in a block than the global statement that declares it?",
     "global", 'must not be used in the same code block textually preceding that "global" statement'),
    ("Which identifiers are soft keywords?",
     "identifiers", 'The identifiers "match", "case" and "_" can syntactically act as keywords'),
    ("In a relative import, what do two leading dots refer to?",
     "import", "Two dots means up one package level."),
    ("Which __future__ feature still changes how code behaves?",
     "import", 'The only feature that requires using the future statement is "annotations"'),
    ("For two strings, when is x in y true?",
     "in", '"x in y" is "True" if and only if *x* is a substring of *y*'),
    ("Why is a decimal integer literal with a leading zero, like 0123, a syntax error?",
     "integers", "This is for disambiguation with C-style octal literals"),
    ("Can the body of a lambda contain statements or annotations?",
     "lambda", "functions created with lambda expressions cannot contain statements or annotations"),
    ("Must a name declared nonlocal already be bound in an enclosing function?",
     "nonlocal", "must refer to pre-existing bindings in an enclosing scope"),
    ("In CPython, what number does id(x) return?",
     "objects", '"id(x)" is the memory address where "x" is stored'),
    ("How can I raise a new exception without chaining the exception being handled?",
     "raise", 'Exception chaining can be explicitly suppressed by specifying "None" in the "from" clause'),
    ("What happens when a return statement runs inside a generator function?",
     "return", 'statement indicates that the generator is done and will cause "StopIteration" to be raised'),
    ("What happens to a pending exception when the finally clause executes a return?",
     "try", "the saved exception is discarded"),
    ("Why can I not set an attribute on a bound method object?",
     "typesmethods", "setting method attributes on bound methods is disallowed"),
    ("What does list.reverse() return?",
     "typesseq-mutable", "it does not return the reversed sequence"),
]


def doc_id(topic: str) -> str:
    return f"langref-{topic}"


def norm(text: str) -> str:
    return " ".join(text.split())


def clean(text: str) -> tuple[str, str]:
    """(title, body): the heading line and its ``****`` underline taken off as the title, the
    footnotes dropped."""
    lines = text.strip("\n").split("\n")
    title, body = lines[0].strip(), "\n".join(lines[2:] if set(lines[1].strip()) == {"*"} else lines[1:])
    body = body.split("-[ Footnotes ]-")[0]
    return title, body.strip() + "\n"


def documents() -> list[dict]:
    picked = {k: clean(v) for k, v in sorted(topics.items())
              if (len(v.split()) <= MAX_WORDS or k in ALSO) and k not in SKIP}
    # Leave out a topic whose text is repeated in another one (pydoc shares sections).
    bodies = {k: norm(b) for k, (_, b) in picked.items()}
    dup = {k for k in picked for j in picked if j != k and bodies[k] in bodies[j]}
    return [{"id": doc_id(k), "title": t, "text": b} for k, (t, b) in picked.items() if k not in dup]


def questions(docs: list[dict]) -> list[dict]:
    by_id = {d["id"]: d for d in docs}
    passages = make_passages(pa.Table.from_pylist(docs), CHUNK_SIZE, OVERLAP)
    rows = []
    for n, (question, topic, evidence) in enumerate(QUESTIONS, start=1):
        did = doc_id(topic)
        if did not in by_id:
            raise SystemExit(f"question {n}: document {did} is not in the corpus")
        holders = [d["id"] for d in docs if norm(evidence) in norm(d["text"])]
        if holders != [did]:
            raise SystemExit(f"question {n}: evidence found in {holders}, expected only {did}")
        answering = [p.id for p in passages if p.doc_id == did and norm(evidence) in norm(p.text)]
        if not answering:
            raise SystemExit(f"question {n}: no passage holds the whole evidence; shorten it")
        rows.append({"id": f"q{n:02d}", "question": question, "answer_doc_id": did,
                     "evidence": evidence, "answer_passage_id": answering[0]})
    return rows


def build(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    docs = documents()
    qs = questions(docs)
    paths = [out_dir / "corpus.parquet", out_dir / "questions.parquet"]
    pq.write_table(pa.Table.from_pylist(docs), paths[0])
    pq.write_table(pa.Table.from_pylist(qs), paths[1])
    return paths


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "data" / "rag"
    for p in build(out):
        print(p, pq.read_metadata(p).num_rows, "rows")
