"""Nexmark Q0, Q1, Q2, Q3 (Nexmark's unwindowed join: Flink's regular join), Q4 (Nexmark's
average price per category: a regular join and two group aggregates), Q5, Q7 and Q8 on
Apache Flink (PyFlink's mini-cluster), for bench/nexmark.sh's side-by-side run (bench/README.md,
"Nexmark"). Windowed queries use Flink's window TVFs (TUMBLE, HOP) and window joins.

Flink SQL over its own `datagen` connector, shaped like Riverbank's generator: bids are 46 of
every 50 Nexmark events, so EVENTS events are EVENTS * 46 / 50 bid rows; event time advances
at RATE events per second from 2024-01-01 (a bid's event number is its sequence * 50 / 46);
the auction is one of the ~100 in flight (sequence * 3 / 50 minus a random 0..99), the bidder
one of the last 1,000 people; channel and url random strings of Riverbank's lengths. Output
goes to JSON files (the filesystem sink, committed at checkpoints every second), as
Riverbank's WriteToJson does (Q4's updates go to Flink's blackhole sink: the filesystem sink
takes no updates). Parallelism 1 (one task slot: one core). People and auctions (Q3, Q4, Q8)
come the same way: EVENTS / 50 people (ids from 1000, event time of event seq * 50) and
EVENTS * 3 / 50 auctions (a seller among the last 100 people, 5 categories from 10, open for
a random time up to twice what ~100 auctions take to open).

CONFIG `default` is Flink's defaults; `tuned` adds what a Flink user sets for such queries:
mini-batch aggregation (`table.exec.mini-batch.*`: 1 s or 5,000 rows) and two-phase (local
then global) aggregation.

Prints one line: query, config, events, seconds from submitting the job to its end, CPU seconds
the JVM spent meanwhile, the JVM's peak resident memory (MB), output rows.

Usage: python flink_nexmark.py QUERY EVENTS RATE OUT_DIR [default|tuned]
"""

import glob
import json
import os
import sys
import time

from pyflink.table import EnvironmentSettings, TableEnvironment

BID_COLUMNS = "auction, bidder, price, channel, url, `dateTime`, extra"

def tumble(table, size="10"):
    return f"TABLE(TUMBLE(TABLE {table}, DESCRIPTOR(`dateTime`), INTERVAL '{size}' SECOND))"


HOP = "TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))"

QUERIES = {
    "q0": f"SELECT {BID_COLUMNS} FROM bid",
    "q1": "SELECT auction, bidder, CAST(price * 0.908 AS BIGINT) AS price, `dateTime` FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    # Nexmark's Q3: an unwindowed (regular) join keeping every person and auction.
    "q3": (
        "SELECT P.name, P.city, P.state, A.id FROM auction AS A "
        "INNER JOIN person AS P ON A.seller = P.id "
        "WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')"
    ),
    # Nexmark's Q4: per category, the average of its auctions' final prices (an auction's
    # highest bid while open); a regular join and two group aggregates, an update stream.
    "q4": (
        "SELECT Q.category, AVG(Q.final) AS average FROM "
        "(SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
        "WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires "
        "GROUP BY A.id, A.category) Q GROUP BY Q.category"
    ),
    # Hot items: per sliding window, the auctions whose bid count is the window's maximum.
    "q5": (
        "SELECT C.auction, C.bids FROM "
        f"(SELECT auction, window_start, window_end, COUNT(*) AS bids FROM {HOP} "
        "GROUP BY auction, window_start, window_end) C JOIN "
        "(SELECT window_start, window_end, MAX(bids) AS top FROM "
        f"(SELECT auction, window_start, window_end, COUNT(*) AS bids FROM {HOP} "
        "GROUP BY auction, window_start, window_end) GROUP BY window_start, window_end) M "
        "ON C.window_start = M.window_start AND C.window_end = M.window_end AND C.bids = M.top"
    ),
    # Highest bid: per 10-s window, the bids whose price is the window's highest.
    "q7": (
        "SELECT B.auction, B.price, B.bidder, B.`dateTime` FROM "
        f"(SELECT * FROM {tumble('bid')}) B JOIN "
        f"(SELECT window_start, window_end, MAX(price) AS top FROM {tumble('bid')} "
        "GROUP BY window_start, window_end) M "
        "ON B.window_start = M.window_start AND B.window_end = M.window_end AND B.price = M.top"
    ),
    # New users: people who opened an auction in the window they registered in.
    "q8": (
        "SELECT P.id, P.name FROM "
        f"(SELECT id, name, window_start, window_end FROM {tumble('person')} "
        "GROUP BY id, name, window_start, window_end) P JOIN "
        f"(SELECT seller, window_start, window_end FROM {tumble('auction')} "
        "GROUP BY seller, window_start, window_end) A "
        "ON P.id = A.seller AND P.window_start = A.window_start AND P.window_end = A.window_end"
    ),
}

SINKS = {
    "q0": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
    "`dateTime` TIMESTAMP_LTZ(3), extra STRING",
    "q1": "auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP_LTZ(3)",
    "q2": "auction BIGINT, price BIGINT",
    "q3": "name STRING, city STRING, state STRING, id BIGINT",
    "q4": "category BIGINT, average BIGINT",
    "q5": "auction BIGINT, bids BIGINT",
    "q7": "auction BIGINT, price BIGINT, bidder BIGINT, `dateTime` TIMESTAMP_LTZ(3)",
    "q8": "id BIGINT, name STRING",
}


# Queries whose result rows are updated (retracted and emitted again) as input arrives.
UPDATING = {"q4"}


def jvm_children():
    """The /proc directories of this process's children (the PyFlink gateway's JVM)."""
    me = str(os.getpid())
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ..., utime (12th), stime (13th).
        if fields[1] == me:
            yield os.path.dirname(stat), fields


def jvm_cpu_seconds():
    """User + system CPU seconds of this process's JVM children."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for _, f in jvm_children())


def jvm_peak_mb():
    """The peak resident memory (VmHWM) of this process's JVM children, in MB."""
    total = 0
    for proc, _ in jvm_children():
        for line in open(os.path.join(proc, "status")):
            if line.startswith("VmHWM:"):
                total += int(line.split()[1]) // 1024
    return total


def main():
    query, events, rate, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    config = sys.argv[5] if len(sys.argv) > 5 else "default"
    bids = events * 46 // 50
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "1")
    conf.set("execution.checkpointing.interval", "1s")
    # The datagen's sequence is operator state larger than the JobManager's in-memory
    # checkpoint limit (5 MiB): checkpoints go to files, as in any real deployment.
    conf.set("execution.checkpointing.storage", "filesystem")
    conf.set("execution.checkpointing.dir", f"file://{out}-checkpoints")
    conf.set("table.exec.source.idle-timeout", "1s")
    if config == "tuned":
        conf.set("table.exec.mini-batch.enabled", "true")
        conf.set("table.exec.mini-batch.allow-latency", "1s")
        conf.set("table.exec.mini-batch.size", "5000")
        conf.set("table.optimizer.agg-phase-strategy", "TWO_PHASE")
    elif config != "default":
        sys.exit(f"unknown config {config!r} (default, tuned)")
    env.execute_sql(f"""
        CREATE TABLE bid (
            seq BIGINT, r_auction INT, r_bidder INT, price BIGINT, channel STRING, url STRING,
            auction AS 1000 + GREATEST(0, seq * 3 / 46 - r_auction),
            bidder AS 1000 + GREATEST(0, seq / 46 - r_bidder),
            `dateTime` AS TO_TIMESTAMP_LTZ(1704067200000 + seq * 50000 / (46 * {rate}), 3),
            extra AS '',
            WATERMARK FOR `dateTime` AS `dateTime`
        ) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '1000000000',
            'fields.seq.kind' = 'sequence',
            'fields.seq.start' = '0',
            'fields.seq.end' = '{bids - 1}',
            'fields.r_auction.min' = '0', 'fields.r_auction.max' = '99',
            'fields.r_bidder.min' = '0', 'fields.r_bidder.max' = '999',
            'fields.price.min' = '100', 'fields.price.max' = '10000000',
            'fields.channel.length' = '7',
            'fields.url.length' = '60'
        )""")
    people, auctions = max(1, events // 50), max(1, events * 3 // 50)
    # An auction is open for up to twice the time ~100 auctions take to open (Riverbank's
    # generator: until about as many have opened again as are in flight).
    open_ms = max(1, round(2 * 100 * 50 / 3 * 1000 / rate))
    states = " ".join(f"WHEN {i} THEN '{s}'" for i, s in enumerate(["AZ", "CA", "ID", "OR", "WA", "WY"]))
    env.execute_sql(f"""
        CREATE TABLE person (
            seq BIGINT, r_state INT, name STRING, city STRING, emailAddress STRING,
            id AS 1000 + seq,
            state AS CASE r_state {states} END,
            `dateTime` AS TO_TIMESTAMP_LTZ(1704067200000 + seq * 50000 / {rate}, 3),
            WATERMARK FOR `dateTime` AS `dateTime`
        ) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '1000000000',
            'fields.seq.kind' = 'sequence',
            'fields.seq.start' = '0',
            'fields.seq.end' = '{people - 1}',
            'fields.r_state.min' = '0', 'fields.r_state.max' = '5',
            'fields.name.length' = '12',
            'fields.city.length' = '10',
            'fields.emailAddress.length' = '20'
        )""")
    env.execute_sql(f"""
        CREATE TABLE auction (
            seq BIGINT, r_seller INT, r_category INT, itemName STRING, reserve BIGINT,
            r_expires INT,
            id AS 1000 + seq,
            seller AS 1000 + GREATEST(0, seq / 3 - r_seller),
            category AS 10 + r_category,
            `dateTime` AS TO_TIMESTAMP_LTZ(1704067200000 + seq * 50000 / (3 * {rate}), 3),
            expires AS TO_TIMESTAMP_LTZ(
                1704067200000 + seq * 50000 / (3 * {rate}) + r_expires, 3),
            WATERMARK FOR `dateTime` AS `dateTime`
        ) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '1000000000',
            'fields.seq.kind' = 'sequence',
            'fields.seq.start' = '0',
            'fields.seq.end' = '{auctions - 1}',
            'fields.r_expires.min' = '0', 'fields.r_expires.max' = '{open_ms}',
            'fields.r_seller.min' = '0', 'fields.r_seller.max' = '99',
            'fields.r_category.min' = '0', 'fields.r_category.max' = '4',
            'fields.itemName.length' = '20',
            'fields.reserve.min' = '100', 'fields.reserve.max' = '10000000'
        )""")
    # Q4's result is an update stream, which the filesystem sink cannot take (Flink's own
    # Nexmark writes every query to its blackhole sink).
    sink = ("'connector' = 'blackhole'" if query in UPDATING else
            f"'connector' = 'filesystem', 'path' = 'file://{out}', 'format' = 'json'")
    env.execute_sql(f"CREATE TABLE sink ({SINKS[query]}) WITH ({sink})")
    cpu0, t0 = jvm_cpu_seconds(), time.time()
    env.execute_sql(f"INSERT INTO sink {QUERIES[query]}").wait()
    took, cpu = time.time() - t0, jvm_cpu_seconds() - cpu0
    rows = 0
    for path in glob.glob(f"{out}/**/*", recursive=True):
        name = os.path.basename(path)
        if os.path.isfile(path) and not name.startswith("."):
            with open(path) as f:
                rows += sum(1 for _ in f)
    print(json.dumps({"query": query, "config": config, "events": events, "seconds": took,
                      "cpu": cpu, "peak_mb": jvm_peak_mb(), "rows": rows}))


if __name__ == "__main__":
    main()
