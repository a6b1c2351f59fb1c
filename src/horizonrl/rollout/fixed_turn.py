"""Fixed-turn collector (Verlog): n_env persistent env streams x e_len turns per iteration.

One asyncio task per stream; the engine batches whatever requests are pending. A stream is reset
only when its episode ends, so an episode can span iterations; each iteration returns the fragment
of every episode that had turns in it. A fragment still running after the e_len turns, or truncated
by the env's time limit, carries the prompt of its next state (no action sampled) so the learner can
bootstrap from its value. A self-play game (the policy in every seat) is not cut: its stream plays it to its end,
and each seat's turns become one episode (rollout/seats.py).

An env call that fails (`EnvError`: it raised or hung, and its handle has rebuilt the env) closes
the running episode as truncated at its last completed turn, with the error in that turn's `info`;
the failed turn's sample is dropped, the error is kept in `collector.errors` (the batch's summarised in
one warning, rollout/failures.py), and the stream starts a new episode. A reset that fails
MAX_RESET_ATTEMPTS times in a row stops the run.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable

from horizonrl.agents.agent import Agent
from horizonrl.engines.base import Engine, SamplingParams
from horizonrl.envs.pool import EnvError
from horizonrl.records import Episode
from horizonrl.rollout.collector import Deliver
from horizonrl.rollout.failures import log_failures
from horizonrl.rollout.seats import by_seat, check_seat_history, seats_to_come
from horizonrl.rollout.seeds import first_training_seed
from horizonrl.rollout.stream import EnvStream, close_on_error, finish_episode, note_errors, play_turn


class FixedTurnCollector:
    def __init__(self, envs: list, agent: Agent, engine: Engine, params: SamplingParams, e_len: int, seed: int = 0,
                 first_stream: int = 0, n_streams: int | None = None):
        """`envs`: async env handles (horizonrl.envs.pool), one per stream; a stream's episodes are
        tasks of its handle's `env_id`. The handles are streams first_stream.. of a run's `n_streams`
        (default: just these): a rank of a torchrun job plays its share of the run's streams, each
        with the seeds (and request seeds) it has in a single process."""
        self.agent, self.engine, self.params, self.e_len = agent, engine, params, e_len
        stride = len(envs) if n_streams is None else n_streams
        self.streams = [EnvStream(i, env, env.env_id, next_seed=first_training_seed(seed) + i, seed_stride=stride)
                        for i, env in enumerate(envs, start=first_stream)]
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def collect(self) -> list[Episode]:
        """Run every stream for e_len turns; the episode fragments, stream by stream, in time order.
        `self.errors` holds the env errors recovered from during this call."""
        return asyncio.run(self._batch())

    async def produce(self, admitted: Callable[[int], Awaitable[bool]], deliver: Deliver) -> None:
        """Asynchronous training (rollout/producer.py): batch after batch, each once `await admitted(b)` allows it
        (False: stop), delivered with the streams' state after it. A stream's next fragment follows its last, so
        the batches do not overlap."""
        b = 0
        while await admitted(b := b + 1):
            fragments = await self._batch()
            deliver(fragments, self.errors, {}, copy.deepcopy(self.state_dict()))

    async def _batch(self) -> list[Episode]:
        self.errors = []
        fragments = await asyncio.gather(*(self._run_stream(s) for s in self.streams))
        log_failures(self.errors, "env errors recovered from in this batch (each closed its episode)")
        return [episode for stream_fragments in fragments for episode in stream_fragments]

    async def _run_stream(self, stream: EnvStream) -> list[Episode]:
        fragments: list[Episode] = []
        episode: Episode | None = None
        played = 0
        while played < self.e_len or seats_to_come(episode, stream.env.seat):
            played += 1
            if stream.observation is None:
                note_errors(await stream.reset(), self.errors)
            if episode is None:
                episode = Episode(stream.episode_id, stream.task, stream.seed)
            try:
                turn, next_observation = await play_turn(stream, self.agent, self.engine, self.params)
            except EnvError as error:
                note_errors([str(error)], self.errors)
                if episode.turns:
                    close_on_error(episode, str(error), stream, self.agent)
                    fragments.extend(by_seat(episode))
                episode, stream.observation = None, None
                continue
            check_seat_history(episode, turn, self.agent)
            episode.turns.append(turn)
            if turn.terminated or turn.truncated:
                finish_episode(episode, turn, stream, self.agent, next_observation)
                fragments.extend(by_seat(episode))
                episode, stream.observation = None, None
            else:
                stream.observation = next_observation
        if episode is not None:
            episode.bootstrap_prompt_ids = self.agent.prompt_ids(stream.env, stream.history, stream.observation)
            fragments.append(episode)
        return fragments

    def state_dict(self) -> dict:
        """Between `collect` calls: every stream's state (see EnvStream.state_dict)."""
        return {"streams": [stream.state_dict() for stream in self.streams]}

    def close(self) -> None:
        """Nothing to stop: the envs and the engine are the caller's."""

    def load_state_dict(self, state: dict) -> None:
        """Restore every stream, replaying its running episode in its env."""
        if len(state["streams"]) != len(self.streams):
            raise ValueError(f"saved with {len(state['streams'])} env streams, not {len(self.streams)}")

        async def restore_all():
            await asyncio.gather(*(s.restore(saved) for s, saved in zip(self.streams, state["streams"])))

        asyncio.run(restore_all())

