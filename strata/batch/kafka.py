"""The Kafka side of a run: watermarks for planning, and offsets for lag tools.

A partition has three watermarks here: its log start, its last stable offset (the end
a `read_committed` reader sees, and so the end a batch plans to) and its high
watermark (the log end, which lag counts to); the two ends differ while a transaction
is open, by what it holds back.

Every request is bounded by `kafka.timeout_s`, so a dead broker or a missing topic is
a clear error within that time, never a hang. Every client's log goes through the
`strata.kafka.client` logger (`strata.batch._client_log.ClientLog`), never straight to
stderr.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
    libversion,
)
from confluent_kafka.admin import AdminClient

from strata.batch import _clients
from strata.batch._client_log import CLIENT_LOG

# The clients' log is this module's to publish: its users import it from here.
from strata.batch._client_log import ClientLog as ClientLog
from strata.batch.plan import PartitionState
from strata.config import KafkaConfig, KafkaSource
from strata.errors import KafkaUnavailable
from strata.log import get_logger
from strata.store.ranges import OffsetRange

logger = get_logger(__name__)


@dataclass
class _Answers:
    """What the brokers answered once for the tables of a routed pipeline (`asked_together`).

    Attributes:
        partitions: The partitions of every topic the brokers listed without an error.
        marks: The low watermark and last stable offset of each partition of the
            tables' topics.
        ends: The high watermark of each of those partitions.
        topics: The tables' topics, which the other answers are about.
        ids: Each of those topics' id (`topic_ids`), where the brokers keep one.
        retention: Each of those topics' retention limits (`retention_limits`), if asked.
        groups: Per consumer group, the offsets it had committed for those partitions.
        matching: Per `topics_pattern` among the tables', the listed topics it matches.
        down: Why the brokers could not be asked, if they could not.
    """

    partitions: dict[str, list[int]]
    marks: dict[tuple[str, int], tuple[int, int]]
    topics: frozenset[str]
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    retention: dict[str, dict[str, int | None]] = field(default_factory=dict)
    groups: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    matching: dict[str, list[str]] = field(default_factory=dict)
    down: KafkaUnavailable | None = None


# The answers in force, per brokers' configuration; set only inside `asked_together`.
_answered: dict[tuple[str, tuple[tuple[str, str], ...]], _Answers] = {}
_answered_lock = threading.Lock()


def _brokers(source: KafkaSource) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The key of the brokers a source is read from, as its clients are configured."""
    return _clients.client_key("brokers", client_conf(source.kafka))


def _known(source: KafkaSource) -> _Answers | None:
    """The answers in force for a source's brokers, if they were asked together."""
    return _answered.get(_brokers(source)) if _answered else None


@contextmanager
def asked_together(sources: Sequence[KafkaSource], *, retention: bool = False) -> Iterator[None]:
    """Within the block, answer the given sources' questions from one set of requests.

    The tables of a routed pipeline read from the same brokers, and each table's run
    (or status) asks them the same questions about its own topics: which partitions,
    their watermarks, the topics' ids and retention. Asked table by table, that is a
    few requests per table, hundreds for hundreds of tables, most of an idle run. Here
    the brokers are asked once for all the tables' topics (every topic listed in one
    metadata request, the watermarks of all partitions in three, the ids, the consumer
    group's offsets and, with `retention`, the retention limits in one each), and
    within the block each table's question on those topics is answered from that: as
    fresh as asking at the block's start. An idle table's offsets that the group holds
    already are not sent again. A question the answers do not cover (a topic missing
    or in error there) is asked of the brokers as before, so each table still fails,
    or not, on its own; so does every question when asking together failed.

    Args:
        sources: The tables' sources; those of other brokers are asked separately.
        retention: Ask for the topics' retention limits too (a status view needs them).
    """
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[KafkaSource]] = {}
    for source in sources:
        groups.setdefault(_brokers(source), []).append(source)
    found = {key: got for key, group in groups.items() if (got := _ask(group, retention))}
    with _answered_lock:
        before = {key: _answered[key] for key in found if key in _answered}
        _answered.update(found)
    try:
        yield
    finally:
        with _answered_lock:
            for key in found:
                _answered.pop(key, None)
            _answered.update(before)


def _ask(group: list[KafkaSource], retention: bool) -> _Answers | None:
    """The brokers' answers for a group of sources reading from them; None if not asked.

    Brokers that cannot be reached give answers that say so (`_Answers.down`): each
    source's first question then fails at once with the error it would have waited for,
    instead of each waiting out the timeout in turn.
    """
    if len(group) < 2:
        return None
    first = group[0]
    try:
        with _consumer(first) as consumer:
            try:
                listed = consumer.list_topics(timeout=first.kafka.timeout_s)
            except KafkaException as exc:
                return _Answers({}, {}, frozenset(), down=_unreachable(first, exc, consumer))
            partitions = {
                topic: sorted(info.partitions)
                for topic, info in listed.topics.items()
                if info.error is None and info.partitions
            }
            patterns = {s.pattern: s for s in group if s.pattern is not None}
            matching = {p: [t for t in partitions if s.matches(t)] for p, s in patterns.items()}
            named = {t for s in group for t in s.topics if t in partitions}
            wanted = sorted(named.union(*matching.values()))
            asked = [TopicPartition(t, p) for t in wanted for p in partitions[t]]
            with _consumer(first, committed=False) as uncommitted:
                ends = _log_ends(first, uncommitted, asked)
            marks = _watermarks(first, consumer, asked)
        answers = _Answers(partitions, marks, frozenset(wanted), ends, matching=matching)
        for source in {s.group_id: s for s in group}.values():
            with _consumer(source) as consumer:
                had = consumer.committed(asked, timeout=source.kafka.timeout_s)
            answers.groups[source.group_id] = {(t.topic, t.partition): t.offset for t in had}
        answers.ids = topic_ids(first, wanted)
        if retention:
            answers.retention = retention_limits(first, wanted)
    except Exception as exc:  # noqa: BLE001 - each table asks on its own, as without this
        logger.debug("the brokers were not asked for %d tables at once: %s", len(group), exc)
        return None
    return answers


def client_version() -> str:
    """The librdkafka version in use (old clients make brokers down-convert)."""
    return f"librdkafka {libversion()[0]}"


def client_conf(kafka: KafkaConfig, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    """librdkafka settings for a pipeline: bootstrap, pass-through properties, extras."""
    conf: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers, "logger": CLIENT_LOG}
    conf.update(kafka.properties)
    conf.update(extra)
    return conf


def _consumer(source: KafkaSource, committed: bool = True) -> AbstractContextManager[Consumer]:
    """The driver's consumer of the pipeline's group, kept and reused (`_clients`).

    Its offsets are those a `read_committed` reader sees (what the tasks read), whatever
    `kafka.properties` says; with `committed` False, those of a `read_uncommitted` one,
    whose latest offset is the high watermark rather than the last stable offset.
    """
    return _clients.consumer(
        client_conf(
            source.kafka,
            **{
                "group.id": source.group_id,
                "enable.auto.commit": False,
                "socket.timeout.ms": int(source.kafka.timeout_s * 1000),
                "isolation.level": "read_committed" if committed else "read_uncommitted",
            },
        )
    )


def _admin(source: KafkaSource) -> AbstractContextManager[AdminClient]:
    """The driver's admin client of the pipeline's brokers, kept and reused (`_clients`)."""
    return _clients.admin(
        client_conf(source.kafka, **{"socket.timeout.ms": int(source.kafka.timeout_s * 1000)})
    )


def _unreachable(
    source: KafkaSource, exc: BaseException | None = None, client: Consumer | None = None
) -> KafkaUnavailable:
    """The one error a request the brokers did not answer ends in, naming them and why."""
    timeout = source.kafka.timeout_s
    if client is not None:
        # A consumer hands its log lines over when polled (or closed): the failures
        # behind the timeout are among them.
        client.poll(0)
    error = exc.args[0] if exc is not None and exc.args else None
    why = [error.str() if isinstance(error, KafkaError) else str(error or "no answer")]
    # The client's own account (connection refused, a TLS or SASL failure) says more.
    failure = CLIENT_LOG.failure_since(timeout + 5)
    if failure:
        why.append(failure)
    return KafkaUnavailable(
        f"cannot reach the brokers at {source.kafka.bootstrap_servers} within "
        f"{timeout:.0f}s ({'; '.join(why)}); check kafka.bootstrap_servers "
        f"(or STRATA_KAFKA_BOOTSTRAP) and the network"
    )


def _topic_partitions(source: KafkaSource, consumer: Consumer) -> dict[str, list[int]]:
    """The partitions of each topic the pipeline reads, as the brokers list them now.

    Listed topics must all be there. A pattern is matched against every topic of the
    cluster (one metadata request), and may match none.
    """
    timeout = source.kafka.timeout_s
    found: dict[str, list[int]] = {}
    known = _known_partitions(source)
    if known is not None:
        return known
    if source.pattern is not None:
        try:
            meta = consumer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise _unreachable(source, exc, consumer) from None
        for topic, info in sorted(meta.topics.items()):
            # A topic being created or deleted may answer with an error; the next run
            # sees it settled.
            if source.reads(topic) and info.error is None and info.partitions:
                found[topic] = sorted(info.partitions)
        return found
    for topic in source.topics:
        try:
            meta = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise _unreachable(source, exc, consumer) from None
        info = meta.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            reason = info.error if info is not None and info.error else "no partitions"
            raise KafkaUnavailable(
                f"topic `{topic}` is not available on {source.kafka.bootstrap_servers} "
                f"({reason}); check the topic name in the pipeline config"
            )
        found[topic] = sorted(info.partitions)
    return found


def _known_partitions(source: KafkaSource) -> dict[str, list[int]] | None:
    """`_topic_partitions` from the answers asked together, if they cover the source.

    Raises:
        KafkaUnavailable: If asking together found the brokers unreachable.
    """
    known = _known(source)
    if known is None:
        return None
    if known.down is not None:
        raise known.down
    if source.pattern is not None:
        matched = known.matching.get(source.pattern)
        if matched is None:
            return None
        return {t: known.partitions[t] for t in sorted(matched) if source.routes_here(t)}
    if not known.partitions.keys() >= set(source.topics):
        # A listed topic missing: asked again, for the error that names it.
        return None
    return {t: known.partitions[t] for t in source.topics}


def pipeline_topics(source: KafkaSource) -> list[str]:
    """The topics the pipeline reads now: its list, or the topics its pattern matches.

    Raises:
        KafkaUnavailable: If the brokers, or a listed topic, cannot be reached.
    """
    if source.pattern is None:
        return list(source.topics)
    with _consumer(source) as consumer:
        return list(_topic_partitions(source, consumer))


def partition_states(
    source: KafkaSource, committed: dict[tuple[str, int], int]
) -> list[PartitionState]:
    """Watermarks of every partition of the pipeline's topics, beside what is committed.

    Where `starting_offsets` is a moment, each partition never read before also gets
    the first offset at or after it (`PartitionState.at_start`), which the planner uses
    for the partitions of a topic new to the pipeline. A partition a transaction left
    open holds back gets its high watermark (`PartitionState.log_end`) and the Kafka
    timestamp of its first unstable offset, asked for those partitions only.

    Args:
        source: The brokers, the pipeline's topics there, and its consumer group.
        committed: End offset of the last committed batch per (topic, partition).

    Returns:
        One state per partition the broker knows.

    Raises:
        KafkaUnavailable: If the brokers or a topic cannot be reached within the timeout.
    """
    with _consumer(source) as consumer:
        asked = [
            TopicPartition(topic, partition)
            for topic, partitions in _topic_partitions(source, consumer).items()
            for partition in partitions
        ]
        # The high watermarks first: a message produced between the two questions then
        # moves the last stable offset up to (or past) them, never looking held back.
        with _consumer(source, committed=False) as uncommitted:
            ends = _log_ends(source, uncommitted, asked)
        marks = _watermarks(source, consumer, asked)
        states = []
        for t in asked:
            low, stable = marks[t.topic, t.partition]
            high = ends[t.topic, t.partition]
            key = (t.topic, t.partition)
            states.append(
                PartitionState(
                    t.topic,
                    t.partition,
                    low,
                    stable,
                    committed.get(key),
                    # A broker that keeps no transactions' state may answer both alike.
                    log_end=high if high > stable else None,
                )
            )
        held = {(s.topic, s.partition): s.high for s in states if s.held_back}
        if held:
            since = first_messages_ms(source, held, committed=False)
            states = [
                replace(s, unstable_since_ms=since.get((s.topic, s.partition)))
                if s.held_back
                else s
                for s in states
            ]
        moment = source.starting_ms
        unread = [s for s in states if s.committed is None]
        if moment is not None and unread:
            found = _offsets_at(source, consumer, unread, moment)
            states = [
                replace(s, at_start=found.get((s.topic, s.partition))) if s.committed is None else s
                for s in states
            ]
        return states


def _watermarks(
    source: KafkaSource, consumer: Consumer, asked: list[TopicPartition]
) -> dict[tuple[str, int], tuple[int, int]]:
    """The low watermark and last stable offset of each partition, asked of the brokers together.

    Two requests for all partitions (each broker answers for its own) rather than one
    per partition: with thousands of partitions, asking one by one was most of a run
    that had nothing to read. The latest offset a `read_committed` consumer is told
    is the last stable offset: the high watermark unless a transaction is open, and
    what a batch can read up to (`_log_ends` asks for the high watermark).

    Raises:
        KafkaUnavailable: If the brokers did not answer, or not for some partition.
    """
    if not asked:
        return {}
    known = _known(source)
    if known is not None and all((t.topic, t.partition) in known.marks for t in asked):
        return {(t.topic, t.partition): known.marks[t.topic, t.partition] for t in asked}
    lows = _watermark_of(source, consumer, asked, OFFSET_BEGINNING)
    stable = _watermark_of(source, consumer, asked, OFFSET_END)
    return {key: (low, stable[key]) for key, low in lows.items()}


def _log_ends(
    source: KafkaSource, uncommitted: Consumer, asked: list[TopicPartition]
) -> dict[tuple[str, int], int]:
    """The high watermark of each partition, in one request for all of them.

    The latest offset a `read_uncommitted` consumer (`uncommitted`) is told: the log
    end, past any transaction still open, which the last stable offset (`_watermarks`)
    stops at.

    Raises:
        KafkaUnavailable: If the brokers did not answer, or not for some partition.
    """
    if not asked:
        return {}
    known = _known(source)
    if known is not None and all((t.topic, t.partition) in known.ends for t in asked):
        return {(t.topic, t.partition): known.ends[t.topic, t.partition] for t in asked}
    return _watermark_of(source, uncommitted, asked, OFFSET_END)


def _watermark_of(
    source: KafkaSource, consumer: Consumer, asked: list[TopicPartition], moment: int
) -> dict[tuple[str, int], int]:
    """Each partition's offset at `moment` (OFFSET_BEGINNING or OFFSET_END), in one request.

    Raises:
        KafkaUnavailable: If the brokers did not answer, or not for some partition.
    """
    try:
        answered = consumer.offsets_for_times(
            [TopicPartition(t.topic, t.partition, moment) for t in asked],
            timeout=source.kafka.timeout_s,
        )
    except KafkaException as exc:
        raise _no_watermarks(source, f"partitions of {_topics(asked)}", exc.args[0]) from None
    found: dict[tuple[str, int], int] = {}
    for tp in answered:
        if tp.error is not None:
            raise _no_watermarks(source, f"partition {tp.partition} of `{tp.topic}`", tp.error)
        found[(tp.topic, tp.partition)] = tp.offset
    missing = [t for t in asked if (t.topic, t.partition) not in found]
    if missing:
        first = missing[0]
        raise _no_watermarks(
            source, f"partition {first.partition} of `{first.topic}`", "no answer for it"
        )
    return found


def _topics(asked: list[TopicPartition]) -> str:
    """The topics of some partitions, for a message."""
    return ", ".join(f"`{t}`" for t in sorted({tp.topic for tp in asked}))


def _no_watermarks(source: KafkaSource, what: str, error: object) -> KafkaUnavailable:
    """The stop when the brokers give no watermarks for `what`."""
    return KafkaUnavailable(
        f"{what}: no watermarks from the brokers at {source.kafka.bootstrap_servers} within "
        f"{source.kafka.timeout_s:.0f}s "
        f"({error.str() if isinstance(error, KafkaError) else error})"
    )


def _offsets_at(
    source: KafkaSource, consumer: Consumer, states: list[PartitionState], moment_ms: int
) -> dict[tuple[str, int], int]:
    """The first offset of each partition whose Kafka timestamp is at or after a moment.

    A partition with no such message starts at its high watermark (everything in it is
    older). A partition the brokers give no answer for is left out: the planner stops
    rather than guess.
    """
    asked = [TopicPartition(s.topic, s.partition, moment_ms) for s in states]
    try:
        answered = consumer.offsets_for_times(asked, timeout=source.kafka.timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"the brokers at {source.kafka.bootstrap_servers} did not say which offsets "
            f"starting_offsets {source.starting_offsets} is at within "
            f"{source.kafka.timeout_s:.0f}s "
            f"({exc.args[0]}); nothing was read. Run again once they answer"
        ) from None
    high = {(s.topic, s.partition): s.high for s in states}
    found: dict[tuple[str, int], int] = {}
    for tp in answered:
        key = (tp.topic, tp.partition)
        if tp.error is not None:
            continue
        # OFFSET_END (-1): no message at or after the moment.
        found[key] = high[key] if tp.offset < 0 else tp.offset
    return found


def topic_ids(source: KafkaSource, topics: Iterable[str] | None = None) -> dict[str, str]:
    """The brokers' id of each of the pipeline's topics, where they keep one.

    Kafka gives every topic an id (since 2.8) that a topic deleted and created again
    under the same name does not keep: it tells the log the committed offsets belong
    to from a new one. Brokers without ids (or that cannot be asked) give none, and
    only the watermark checks guard against a re-created topic there.

    Args:
        source: The brokers, the pipeline's topics there, and its consumer group.
        topics: The topics to ask about; by default those the pipeline reads now.

    Returns:
        `{topic: id}` for the topics the brokers gave an id for.

    Raises:
        KafkaUnavailable: If the brokers do not answer within `kafka.timeout_s`.
    """
    from confluent_kafka import TopicCollection

    found: dict[str, str] = {}
    asked = sorted(pipeline_topics(source) if topics is None else topics)
    if not asked:
        return found
    known = _known(source)
    if known is not None and known.topics.issuperset(asked):
        return {t: known.ids[t] for t in asked if t in known.ids}
    with _admin(source) as admin:
        try:
            futures = admin.describe_topics(
                TopicCollection(asked), request_timeout=source.kafka.timeout_s
            )
        except (KafkaException, ValueError, TypeError):
            return found
        described_all = {}
        for topic, future in futures.items():
            try:
                described_all[topic] = future.result(source.kafka.timeout_s)
            except KafkaException:
                continue
            except TimeoutError:
                raise _unreachable(source) from None
    for topic, described in described_all.items():
        uid = str(described.topic_id) if described.topic_id is not None else ""
        # An all-zero id is how the protocol says "none".
        if uid and uid.strip("A=") != "":
            found[topic] = uid
    return found


def publish_offsets(source: KafkaSource, ranges: list[OffsetRange]) -> str | None:
    """Commit the batch's end offsets to the pipeline's consumer group.

    Lag tools (Burrow, kafka-consumer-groups) read the group; the ledger stays the
    truth, so a failure here is reported, not raised.

    Args:
        source: The brokers, the pipeline's topics there, and its consumer group.
        ranges: The committed ranges; each partition's end offset is published.

    Returns:
        None on success, or a sentence saying what failed.
    """
    offsets = [TopicPartition(r.topic, r.partition, r.end) for r in ranges]
    known = _known(source)
    had = None if known is None else known.groups.get(source.group_id)
    if had is not None and all(had.get((t.topic, t.partition)) == t.offset for t in offsets):
        # The group holds these offsets already (an idle run of a table): nothing to send.
        return None
    if not offsets:
        return None
    try:
        with _consumer(source) as consumer:
            consumer.commit(offsets=offsets, asynchronous=False)
        return None
    except KafkaException as exc:
        return f"could not publish offsets to consumer group {source.group_id!r}: {exc.args[0]}"


def retention_limits(
    source: KafkaSource, topics: Iterable[str] | None = None
) -> dict[str, dict[str, int | None]]:
    """Each topic's `retention.ms` and `retention.bytes`; None where unlimited or unknown.

    Args:
        source: The brokers, the pipeline's topics there, and its consumer group.
        topics: The topics to ask about; by default those the pipeline reads now.

    Returns:
        `{topic: {"ms": ..., "bytes": ...}}`.

    Raises:
        KafkaUnavailable: If the brokers do not answer within `kafka.timeout_s`.
    """
    # The admin module defines ConfigResource without listing it in `__all__`.
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    asked = sorted(pipeline_topics(source) if topics is None else topics)
    known = _known(source)
    if known is not None and all(t in known.retention for t in asked):
        return {t: known.retention[t] for t in asked}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in asked]
    if not resources:
        return {}
    answers: dict[str, Any] = {}
    with _admin(source) as admin:
        for resource, future in admin.describe_configs(resources).items():
            try:
                answers[resource.name] = future.result(source.kafka.timeout_s)
            except KafkaException:
                answers[resource.name] = {}
            except TimeoutError:
                raise _unreachable(source) from None
    out: dict[str, dict[str, int | None]] = {}
    for name, entries in answers.items():
        limits: dict[str, int | None] = {}
        for key in ("ms", "bytes"):
            entry = entries.get(f"retention.{key}")
            value = int(entry.value) if entry is not None and entry.value not in (None, "") else -1
            limits[key] = value if value > 0 else None
        out[name] = limits
    return out


def first_messages_ms(
    source: KafkaSource,
    positions: dict[tuple[str, int], int],
    *,
    committed: bool = True,
    wait_s: float = 5.0,
) -> dict[tuple[str, int], int]:
    """Kafka timestamp (epoch ms) of the first message at or after an offset, per partition.

    Args:
        source: The brokers, the pipeline's topics there, and its consumer group.
        positions: The offset per (topic, partition).
        committed: Read as a `read_committed` reader does; False reads the records of
            transactions still open too (the first unstable offset's message is one).
        wait_s: How long to wait for the messages.

    Returns:
        Timestamps for the partitions whose message arrived in time and carries one.
    """
    if not positions:
        return {}
    consumer = Consumer(
        client_conf(
            source.kafka,
            **{
                "group.id": source.group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
            },
        )
    )
    found: dict[tuple[str, int], int] = {}
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
        deadline = time.monotonic() + wait_s
        while len(found) < len(positions) and time.monotonic() < deadline:
            messages: list[Any] = consumer.consume(100, timeout=0.5)
            for m in messages:
                key = (m.topic(), m.partition())
                if m.error() is None and key not in found:
                    kind, ts = m.timestamp()
                    if kind != 0 and ts >= 0:
                        found[key] = ts
                    consumer.pause([TopicPartition(key[0], key[1])])
    finally:
        consumer.close()
    return found
