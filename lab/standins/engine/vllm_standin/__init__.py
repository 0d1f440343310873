"""STAND-IN for the vLLM serving engine -- sparkserve lab only, never part of the shipped roles.

The lab has no GPU and cannot pull the real serving image, so the rank containers run this
stdlib-only package instead (``python3 -m vllm_standin``, through the ``vllm`` launcher).  It
accepts the exact ``vllm serve`` command line and environment of ``reference-config.md``, checks
them the way a real start-up would fail on them, performs a real TCP rendezvous between rank 0
and the headless ranks, and then serves a small OpenAI-compatible API with deterministic answers
and realistic (configurable) timing, so the roles, the smoke test, the benchmark and Pi can be
exercised end to end.

Modules, in the order a start-up uses them:

- ``cli``: the argparse command line, the cross-flag rules and ``main`` (the start-up sequence);
- ``checks``: the environment checks (model directory, EXL3 plan, fabric interface, cache);
- ``settings``: the ``STANDIN_*`` settings and faults;
- ``faults``: the faults in force, the run-time fault file, hang, crash, exit_on_start, leak;
- ``rendezvous``: rank 0 and the headless ranks, fingerprints and heartbeats;
- ``api``: the OpenAI-compatible HTTP routes of rank 0 (with ``metrics``: ``GET /metrics``);
- ``answers`` (with ``png``): what is answered, a deterministic function of the request;
- ``generation``: one answer's token timing and its OpenAI wire format;
- ``log``: stderr lines and the request log; ``errors``: the two error kinds.

Token accounting (documented in README.md): one token is one whitespace-separated word; a
``/v1/completions`` prompt given as token ids counts ``len(ids)``; every streamed chunk carries
exactly one token.
"""

STANDIN_VERSION = "0.1.0+sparkserve.standin"
