"""Tasks that start from a revealed state (`Task.prefix`): their reference continuation, and the
check a prefix task passes before it can reach training.

The environment replays a task's prefix right after the prompt (`sentinel.env.environment`), so
the policy starts from the state the prefix reached. The reference trajectory of such a task is
that replay (mask 0) followed by a reference continuation (mask 1), chosen by one rule:

1. When the prefix made exactly the reference solution's first calls, one call per turn (same
   tools, same arguments, failed attempts included, as the reference meets the task's scheduled
   faults too), the continuation is the rest of the reference solution's turns.
2. Otherwise (the prefix went its own way: other operands, a repeated call, a retry the
   reference does not make), the continuation is the family's solver run against the tools in the
   state the prefix left them in (`family.solve(spec, tools)` on the replay's tools): "the
   reference solution from the state reached". For arith this is always correct: the calculator is
   pure, the answer does not depend on the path, and a scheduled fault the prefix has already met
   is spent (the solver applies the remedy of any it still meets). A family whose tools hold state
   the solver cannot continue from gets a continuation that fails to verify, and `prefix_problem`
   rejects the task.

`prefix_problem` is the validation check: None when the task can start an episode from its prefix
under the run's environment limits and its reference continuation verifies, else why not.
"""

from __future__ import annotations

from typing import Any

from sentinel.types import Task, canonical_json

# `family` below is a `sentinel.tasks.base.TaskFamily`, left untyped: `base` imports this module
# (for `reference_trajectory`), and the layer contract forbids the cycle back.


def reference_continuation(family: Any, task: Task, chat: Any, parser: Any,
                           env: Any) -> list[str]:
    """The assistant turns that finish `task` after its prefix (see the module docstring);
    `family` is the task's `TaskFamily`; `chat`, `parser`, `env`: a `ChatFormat`, a tool-call
    parser and an `EnvConfig`. Raises what the solver raises when it cannot finish from the state
    reached."""
    from sentinel.env.environment import replay

    tools = family.tool_map(task.spec)
    revealed = replay(task, [], tools, chat, parser, env,
                      follow_ups=family.follow_up_turns(task.spec)).steps
    reference = family.solve(task.spec, family.tool_map(task.spec))
    n = len(revealed)
    first_user_turn = reference.turn_sizes[0] if reference.turn_sizes else len(reference.calls)
    made = [(s.tool, canonical_json(s.arguments)) for s in revealed]
    wanted = [(c.tool, canonical_json(c.arguments)) for c in reference.calls[:n]]
    one_call_turns = [s.turn for s in revealed] == list(range(n))
    if (n <= first_user_turn and one_call_turns and made == wanted
            and all(s.kind == "tool_call" for s in revealed)):
        return reference.assistant_turns()[n:]
    return family.solve(task.spec, tools).assistant_turns()


def prefix_problem(family: Any, task: Task, chat: Any, parser: Any,
                   env: Any) -> str | None:
    """Why `task`'s prefix cannot start an episode under `env` (an `EnvConfig`: its turn and
    token limits), or why its reference continuation fails; None when it is a valid start state.
    Anything the family's code raises is reported, never propagated."""
    import random

    from sentinel.env.environment import Episode

    episode = Episode(task, family.tool_map(task.spec), chat, parser, env, random.Random(0),
                      follow_ups=family.follow_up_turns(task.spec))
    if episode.prefix_problem is not None:
        return episode.prefix_problem
    try:
        trajectory = family.reference_trajectory(task, chat, parser, env)
        verified = family.verify_trajectory(task, trajectory)
    except Exception as exc:  # untrusted spec and prefix: reported, see the docstring
        return f"no reference continuation from the revealed state: {type(exc).__name__}: {exc}"
    if not verified:
        return (f"the reference continuation from the revealed state does not verify "
                f"(answered {trajectory.answer!r}, expected {task.answer!r})")
    return None
