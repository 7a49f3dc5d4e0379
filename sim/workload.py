"""Workload profiles shared by the built-in (in-process) workload and the HTTP load generator.

A profile is a closed loop of N users. Each user asks for one request at a time and, when it
completes, builds the next one. Token ids stay in [3, 300) so that the same prompts work against a
real SGLang server with a tiny test tokenizer.

* `incident`: ~400-token prompts (a short shared system prompt, then unique text) and long
  generations of ~3.5K tokens (gamma-distributed, 25% spread), ~3.9K tokens per request in all.
  Little prefix sharing: the synthetic-data job of the Kimi-K2.5 incident.
* `multi-turn`: chat sessions over a shared system prompt and a per-session document; every turn
  resends the whole conversation, so prompts share growing prefixes and the prefix cache (and the
  hierarchical cache once the GPU evicts) pays off. Users join a server mid-conversation (at a
  uniform turn), as real clients do after a restart.
* `short-chat`: short prompts and answers; light KV pressure.
* `uniform`: prompts of U(400, 1000) tokens and outputs of U(1000, 4000), each drawn
  independently; the incident's shape with a wider, flat spread of request lengths, as used on
  the real GPU (`tests/real_gpu/`).
* `conversations`: the multi-turn chats, but more of them than clients, each turn taken by
  whichever client is free: a conversation comes back about `conversations / clients` requests
  later, by when a full GPU pool has usually evicted its history. The reuse a host tier serves
  and the GPU alone cannot.
* `working-set`: questions about a fixed set of shared documents, `working_set_tokens` of them
  in all (size it just above the GPU pool): every prompt's prefix is reused, but not all of them
  fit on the GPU at once.

Options (`make_profile(name, **options)`, `python -m sim.load --profile-option KEY=VALUE`) set a
profile's numeric fields, e.g. `conversations=400` or `working_set_tokens=200000`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields

TOKEN_LOW, TOKEN_HIGH = 3, 300


@dataclass(frozen=True)
class RequestSpec:
    input_ids: tuple[int, ...]
    max_new_tokens: int
    user: int
    turn: int
    ignore_eos: bool = True  # False: the server's model decides where the answer ends


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(n))


@dataclass
class _Session:
    history: tuple[int, ...]
    turns_left: int
    turn: int = 0


@dataclass
class Profile:
    """Base: subclasses decide the next request of a user and how to absorb its answer."""

    seed: int = 0
    rng: random.Random = field(init=False)

    name = "base"

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def next_request(self, user: int) -> RequestSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def completed(self, user: int, spec: RequestSpec, output_ids: list[int]) -> None:
        """Called when a user's request finished, with what the server generated."""
        return

    def most_clients(self) -> int | None:
        """How many clients the profile can serve at once, where it is bounded."""
        return None


@dataclass
class IncidentProfile(Profile):
    system_prompt_tokens: int = 120
    mean_prompt_tokens: int = 300
    mean_output_tokens: int = 3500
    max_output_tokens: int = 8192
    name = "incident"
    _system: tuple[int, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        self._system = _tokens(random.Random(self.seed + 7), self.system_prompt_tokens)

    def next_request(self, user: int) -> RequestSpec:
        spread = self.rng.lognormvariate(0, 0.5)
        body = int(min(4000, max(100, spread * self.mean_prompt_tokens * 0.9)))
        # Output lengths are fixed per request (ignore_eos), gamma-distributed around the mean
        # with a 25% coefficient of variation, so max_new_tokens is the real length.
        out = self.rng.gammavariate(16.0, self.mean_output_tokens / 16.0)
        out_tokens = int(min(self.max_output_tokens, max(256, out)))
        return RequestSpec(self._system + _tokens(self.rng, body), out_tokens, user, 0)


@dataclass
class MultiTurnProfile(Profile):
    system_prompt_tokens: int = 500
    document_tokens: int = 2000
    user_message_tokens: int = 150
    answer_tokens: int = 300
    turns_per_session: int = 8
    name = "multi-turn"
    _system: tuple[int, ...] = field(init=False, default=())
    _sessions: dict[int, _Session] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._system = _tokens(random.Random(self.seed + 11), self.system_prompt_tokens)

    def next_request(self, user: int) -> RequestSpec:
        session = self._sessions.get(user)
        if session is None:
            session = self._joined_mid_conversation()
            self._sessions[user] = session
        elif session.turns_left <= 0:
            session = self._new_session()
            self._sessions[user] = session
        message = self._message()
        prompt = session.history + message
        answer = int(self.answer_tokens * self.rng.uniform(0.5, 1.5))
        return RequestSpec(prompt, max(8, answer), user, session.turn)

    def _new_session(self) -> _Session:
        doc = _tokens(self.rng, int(self.document_tokens * self.rng.uniform(0.5, 1.5)))
        return _Session(self._system + doc, self.turns_per_session)

    def _message(self) -> tuple[int, ...]:
        return _tokens(self.rng, int(self.user_message_tokens * self.rng.uniform(0.5, 1.5)))

    def _joined_mid_conversation(self) -> _Session:
        """A user's first request to this server: their conversation is already under way.

        Real clients keep their conversations when a server restarts (they resend the whole
        history), so the users of a server just started are at every turn of their sessions,
        as in the steady state: a uniform turn, with the history of the turns before it.
        Starting everyone at turn 0 made prompts 40% shorter after every restart than before
        it, which the gate rightly read as the load changing.
        """
        session = self._new_session()
        done = self.rng.randrange(self.turns_per_session)
        for _ in range(done):
            answer = int(self.answer_tokens * self.rng.uniform(0.5, 1.5))
            session.history += self._message() + _tokens(self.rng, max(8, answer))
        session.turns_left -= done
        session.turn = done
        return session

    def completed(self, user: int, spec: RequestSpec, output_ids: list[int]) -> None:
        session = self._sessions.get(user)
        if session is None:
            return
        session.history = spec.input_ids + tuple(output_ids)
        session.turns_left -= 1
        session.turn += 1


@dataclass
class ShortChatProfile(Profile):
    system_prompt_tokens: int = 60
    name = "short-chat"
    _system: tuple[int, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        self._system = _tokens(random.Random(self.seed + 13), self.system_prompt_tokens)

    def next_request(self, user: int) -> RequestSpec:
        body = self.rng.randint(40, 400)
        out = self.rng.randint(32, 300)
        return RequestSpec(self._system + _tokens(self.rng, body), out, user, 0)


@dataclass
class UniformProfile(Profile):
    """Prompt and output lengths drawn uniformly from fixed ranges, nothing shared between
    requests: a load whose mix does not depend on what the server answers."""

    prompt_tokens: tuple[int, int] = (400, 1000)
    output_tokens: tuple[int, int] = (1000, 4000)
    name = "uniform"

    def next_request(self, user: int) -> RequestSpec:
        prompt = self.rng.randint(*self.prompt_tokens)
        out = self.rng.randint(*self.output_tokens)
        return RequestSpec(_tokens(self.rng, prompt), out, user, 0)


@dataclass
class LongContextProfile(UniformProfile):
    """Long prompts, shorter answers, within an 8,192-token context: every request a long
    (chunked) prefill while the pool is full of long histories, where activations peak."""

    prompt_tokens: tuple[int, int] = (5000, 7000)
    output_tokens: tuple[int, int] = (500, 1000)
    name = "long-context"


@dataclass
class ConversationsProfile(MultiTurnProfile):
    """Chats that outnumber the clients. A client takes a free conversation at random for each
    request and gives it back when the answer comes, so a history returns after others have
    pushed it out of a full GPU pool."""

    conversations: int = 600
    name = "conversations"
    _free: list[int] = field(init=False, default_factory=list)
    _taken: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.conversations < 1:
            raise ValueError(f"conversations must be at least 1, got {self.conversations}")
        self._free = list(range(self.conversations))

    def next_request(self, user: int) -> RequestSpec:
        if user in self._taken:  # its last request failed: that conversation is free again
            self._free.append(self._taken.pop(user))
        if not self._free:
            raise ValueError(
                f"more clients than conversations ({self.conversations}): raise conversations"
            )
        chat = self._free.pop(self.rng.randrange(len(self._free)))
        self._taken[user] = chat
        spec = super().next_request(chat)
        return RequestSpec(spec.input_ids, spec.max_new_tokens, user, spec.turn)

    def most_clients(self) -> int | None:
        return self.conversations

    def completed(self, user: int, spec: RequestSpec, output_ids: list[int]) -> None:
        chat = self._taken.pop(user, None)
        if chat is None:
            return
        super().completed(chat, spec, output_ids)
        self._free.append(chat)


@dataclass
class WorkingSetProfile(Profile):
    """Short questions about shared documents: the documents (`working_set_tokens` in all,
    `document_tokens` each) are the prefixes every request reuses; short answers keep the load
    prefill-heavy, where a reused prefix saves the most."""

    working_set_tokens: int = 200_000
    document_tokens: int = 4000
    question_tokens: tuple[int, int] = (50, 150)
    answer_tokens: tuple[int, int] = (100, 300)
    name = "working-set"
    _documents: list[tuple[int, ...]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.document_tokens < 1 or self.working_set_tokens < self.document_tokens:
            raise ValueError(
                f"working_set_tokens ({self.working_set_tokens}) must hold at least one "
                f"document of document_tokens ({self.document_tokens})"
            )
        docs = random.Random(self.seed + 17)
        count = self.working_set_tokens // self.document_tokens
        self._documents = [_tokens(docs, self.document_tokens) for _ in range(count)]

    def next_request(self, user: int) -> RequestSpec:
        doc = self._documents[self.rng.randrange(len(self._documents))]
        question = _tokens(self.rng, self.rng.randint(*self.question_tokens))
        return RequestSpec(doc + question, self.rng.randint(*self.answer_tokens), user, 0)


PROFILES: dict[str, type[Profile]] = {
    "conversations": ConversationsProfile,
    "working-set": WorkingSetProfile,
    "incident": IncidentProfile,
    "long-context": LongContextProfile,
    "multi-turn": MultiTurnProfile,
    "short-chat": ShortChatProfile,
    "uniform": UniformProfile,
}


def make_profile(name: str, seed: int = 0, **options: int) -> Profile:
    """The profile `name`, with any of its integer fields set from `options`."""
    try:
        cls = PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown workload profile {name!r}; choose one of: {known}") from None
    settable = sorted(
        f.name for f in fields(cls) if f.init and f.name != "seed" and f.type in ("int", int)
    )
    unknown = sorted(set(options) - set(settable))
    if unknown:
        raise ValueError(
            f"profile {name!r} has no option {', '.join(unknown)}; its options: "
            + (", ".join(settable) or "none")
        )
    return cls(seed=seed, **options)


def profile_options(pairs: list[str]) -> dict[str, int]:
    """`KEY=VALUE` pairs from a command line, each value a whole number."""
    options: dict[str, int] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        try:
            if not eq or not key:
                raise ValueError
            options[key.strip()] = int(value.replace("_", ""))
        except ValueError:
            raise ValueError(
                f"a profile option is KEY=WHOLE_NUMBER, e.g. conversations=400; got {pair!r}"
            ) from None
    return options
