"""Structured output: a request's tokens constrained by a grammar (JSON schema, JSON
object, regex, EBNF, choice), in plain and speculative steps alike, through xgrammar.

    params.py    StructuredOutput: the constraint (SamplingParams.structured_output)
    compiler.py  GrammarCompiler: constraint -> compiled grammar (cached), per-request state
    matcher.py   RequestGrammar (the committed output's matcher), host bitmasks per step /
                 per draft-tree node
    mask.py      the bitmasks applied to logits on the device

Data flow: server / LLM -> SamplingParams.structured_output -> Engine.add_request
(Request.grammar) -> BatchBuilder.prepare (the step's masks) -> ModelRunner.sample_tokens
or SpecRunner (per verified node) -> Scheduler.commit (the grammar accepts the tokens;
a finished grammar stops the request).
"""
