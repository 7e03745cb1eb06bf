#!/bin/bash
# Topic-init step of docker-compose.yml (runs in the apache/kafka image, then exits 0).
# Creates the reports topic with $REPORTS_PARTITIONS partitions, the compacted state topic (one
# record per "<pipeline>/<partition>" key survives compaction: the latest checkpoint; 16 MiB
# records, as the workers create it: a checkpoint holds the regressions' warm-up reports) and the
# dead-letter topic. Idempotent (--if-not-exists). The values come from docker-compose.yml and must
# match deploy/config/flights.pipeline.toml [topics] (checked by tests/test_deploy.py).
set -euo pipefail
: "${BOOTSTRAP:?}" "${REPORTS_TOPIC:?}" "${STATE_TOPIC:?}" "${DEAD_LETTER_TOPIC:?}" "${REPORTS_PARTITIONS:?}"
KT=/opt/kafka/bin/kafka-topics.sh

for i in $(seq 1 60); do
  if "$KT" --bootstrap-server "$BOOTSTRAP" --list >/dev/null 2>&1; then break; fi
  echo "waiting for Kafka at $BOOTSTRAP ($i)"; sleep 2
done

"$KT" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$REPORTS_TOPIC" \
  --partitions "$REPORTS_PARTITIONS" --replication-factor 1
"$KT" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$STATE_TOPIC" \
  --partitions 1 --replication-factor 1 --config cleanup.policy=compact \
  --config max.message.bytes=16777216
"$KT" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$DEAD_LETTER_TOPIC" \
  --partitions 1 --replication-factor 1 --config retention.ms=1209600000
"$KT" --bootstrap-server "$BOOTSTRAP" --describe --topic "$REPORTS_TOPIC"
