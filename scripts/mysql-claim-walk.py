#!/usr/bin/env python3
"""What a MySQL claim's walk costs (docs/BENCHMARKS.md, session 25,
"MySQL's claims walk unpurged entries"): a copy of baton's claim index on
a 60,000-row table; per run, N rows at the head either marked `running`
while another session's snapshot keeps purge from removing their
delete-marked `pending` entries (`tomb N`), or held `FOR UPDATE` by
another session (`locked N`); then 200 claim selects of 20 rows are timed.

    scripts/mysql-claim-walk.py setup
    scripts/mysql-claim-walk.py tomb 2000
    scripts/mysql-claim-walk.py locked 2000

`MYSQL` (default `mysql -uroot -h127.0.0.1 -P3398 test`) is the client
command; use a private server."""
import os
import subprocess
import sys
import time

M = os.environ.get("MYSQL", "mysql -uroot -h127.0.0.1 -P3398 test").split()
SETUP = """DROP TABLE IF EXISTS walk_tt;
CREATE TABLE walk_tt (id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARBINARY(255) NOT NULL,
  state VARCHAR(16) NOT NULL, priority INT NOT NULL DEFAULT 0, run_at DATETIME(6) NOT NULL,
  cancel_requested TINYINT NOT NULL DEFAULT 0, attempt INT NOT NULL DEFAULT 0,
  max_attempts INT NOT NULL DEFAULT 25, pad VARCHAR(200),
  KEY claim (queue, state, priority, run_at, id)) ENGINE=InnoDB;
INSERT INTO walk_tt (queue, state, run_at, pad)
  SELECT 'q', 'pending', NOW(6) - INTERVAL 1 HOUR, REPEAT('x', 100) FROM seq_1_to_60000;"""
CLAIM = ("START TRANSACTION; SELECT id FROM walk_tt WHERE queue='q' AND state='pending' "
         "AND run_at <= NOW(6) AND cancel_requested=0 ORDER BY priority, run_at, id "
         "LIMIT 20 FOR UPDATE SKIP LOCKED; ROLLBACK")


def sql(text):
    subprocess.run(M + ["-N", "-e", text], stdout=subprocess.DEVNULL, check=True)


def hold(text):
    """Run `text` then sleep 30 s in another session (killed after the timing)."""
    p = subprocess.Popen(M + ["-e", text + "; SELECT SLEEP(30)"], stdout=subprocess.DEVNULL)
    time.sleep(0.8)
    return p


def timed():
    t = time.time()
    sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; " + "; ".join([CLAIM] * 200))
    return (time.time() - t) * 5  # ms per select


def main():
    mode = sys.argv[1]
    if mode == "setup":
        sql(SETUP)
        return
    n = int(sys.argv[2])
    sql("UPDATE walk_tt SET state='pending' WHERE state<>'pending'")
    time.sleep(3)  # let purge catch up
    if mode == "tomb":
        p = hold("START TRANSACTION WITH CONSISTENT SNAPSHOT; SELECT COUNT(*) FROM walk_tt WHERE id=1")
        sql(f"UPDATE walk_tt SET state='running' WHERE id <= {n}")
    elif mode == "locked":
        p = hold("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; "
                 f"SELECT COUNT(*) FROM (SELECT id FROM walk_tt WHERE queue='q' AND state='pending' "
                 f"ORDER BY priority, run_at, id LIMIT {n} FOR UPDATE) x")
    else:
        sys.exit(f"unknown mode {mode!r}: setup, tomb N or locked N")
    try:
        print(f"{mode} {n}: {timed():.2f} ms per claim select")
    finally:
        p.kill()


if __name__ == "__main__":
    main()
