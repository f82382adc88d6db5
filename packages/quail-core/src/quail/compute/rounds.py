"""A LIMIT met early on one worker: the model reads the documents in rounds and stops once the rows are there.

`quail.planner.partition.plan_rounds` cuts the last phase's documents into rounds in document order, the
first sized from the planner's selectivity estimate and each next one twice as large. The rounds run one
after the other through the provider's own way of running a request; after each, `limit_reached` asks the
runtime whether the rounds so far already hold the LIMIT's first rows — the same rows the whole plan
returns, since rows reach the LIMIT in document order. The rounds never started are reported as cancelled
(explain and the report: "stopped after N of M documents"), and stored answers of the rounds that ran are
read as always. `EngineConfig(early_limit="off")` runs the whole plan instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from quail.compute.request import PhysicalRequest, PhysicalResponse, ShardMetrics
from quail.compute.sharding import (
    Answers,
    finish,
    limit_reached,
    merge_answers,
    merge_metrics,
    scan_port,
    shard_metrics,
    shard_request,
)
from quail.planner.partition import Partition, Phase, Shard, plan_rounds

RunRequest = Callable[[PhysicalRequest], PhysicalResponse]


def rounds_of(request: PhysicalRequest) -> Partition | None:
    """The rounds a request runs in, or None to run it whole: no LIMIT to stop at, early stops off, or the request
    is already one part of a query a provider split (its known ports say so)."""
    if request.config.early_limit == "off" or request.known:
        return None  # known ports: a part of a query another provider already split; it runs as it is sent
    tokens = {alias: table.tokens for alias, table in request.tables.items() if table.tokens is not None}
    partition = plan_rounds(request.graph, tokens)
    if partition is None or partition.rounds == 0 or len(partition.phases[-1].shards) < 2:
        return None
    return partition


def execute_in_rounds(request: PhysicalRequest, partition: Partition, run: RunRequest,
                      worker: str = "local") -> PhysicalResponse:
    """Run the whole phases, then the rounds — every round phase's shard of the round in turn — until the LIMIT
    is met, and the request's outputs over what ran."""
    started = time.perf_counter()
    whole, in_rounds = partition.phases[:len(partition.phases) - partition.rounds], \
        partition.phases[len(partition.phases) - partition.rounds:]
    answers: Answers = {}
    responses: list[PhysicalResponse] = []
    shards: list[ShardMetrics] = []
    for phase in whole:
        answered = [(shard, run(shard_request(request, phase, shard, answers))) for shard in phase.shards]
        answers.update(merge_answers(request.graph, phase, answered))
        responses.extend(response for _, response in answered)
        shards.extend(shard_metrics(phase, shard, worker, response) for shard, response in answered)
    last = in_rounds[-1]
    done: dict[int, list[tuple[Shard, PhysicalResponse]]] = {phase.index: [] for phase in in_rounds}
    covered = None
    for number, _ in enumerate(last.shards):
        this_round = dict(answers)
        for phase in in_rounds:
            shard = phase.shards[number]
            response = run(shard_request(request, phase, shard, this_round))
            done[phase.index].append((shard, response))
            this_round.update(merge_answers(request.graph, phase, [(shard, response)]))
            responses.append(response)
            shards.append(shard_metrics(phase, shard, worker, response))
        if number + 1 < len(last.shards):
            so_far = {**answers, **_merged(request, in_rounds, done)}
            covered = limit_reached(request, partition, last, so_far, range(number + 1))
            if covered is not None:
                shards.extend(shard_metrics(phase, rest, worker, None) for phase in in_rounds
                              for rest in phase.shards[number + 1:])
                break
    answers.update(_merged(request, in_rounds, done))
    restrict = {scan_port(request.graph, last.alias): covered} if covered is not None and last.alias else None
    finished = finish(request, answers, restrict)
    metrics = merge_metrics(request.graph, responses, shards, finished.node_metrics, time.perf_counter() - started)
    return PhysicalResponse(finished.tables, metrics)


def _merged(request: PhysicalRequest, phases: tuple[Phase, ...],
            done: dict[int, list[tuple[Shard, PhysicalResponse]]]) -> Answers:
    merged: Answers = {}
    for phase in phases:
        merged.update(merge_answers(request.graph, phase, done[phase.index]))
    return merged
