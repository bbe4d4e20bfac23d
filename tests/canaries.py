"""Canary secrets for the secrets tests of both tiers, and the check that none leaked."""

from __future__ import annotations

from typing import Any

# One canary per secret, so a failure names the secret that leaked.
CANARIES = {
    "KAFKA_PASSWORD": "canary-kafka-password-5Yq",
    "KAFKA_KEY_PASSWORD": "canary-ssl-key-password-Hw2",
    "OAUTH_CLIENT_SECRET": "canary-oauth-client-secret-Lm9",
    "OAUTH_CONFIG_SECRET": "canary-oauth-config-Zt4",
    "S3_ACCESS_KEY": "canary-s3-access-key-Pe7",
    "S3_SECRET": "canary-s3-secret-Xc3",
    "S3_TOKEN": "canary-s3-session-token-Rb8",
    "SPARK_S3A_SECRET": "canary-spark-s3a-secret-Gk1",
    "METASTORE_PASSWORD": "canary-metastore-password-Vd6",
    "TRINO_PASSWORD": "canary-trino-password-Jn5",
}

KAFKA_SECRETS = {
    "sasl.password": "${KAFKA_PASSWORD}",
    "ssl.key.password": "${KAFKA_KEY_PASSWORD}",
    "sasl.oauthbearer.client.secret": "${OAUTH_CLIENT_SECRET}",
    "sasl.oauthbearer.config": "principal=strata extension_secret=${OAUTH_CONFIG_SECRET}",
}
S3_SECRETS = {
    "AWS_ACCESS_KEY_ID": "${S3_ACCESS_KEY}",
    "AWS_SECRET_ACCESS_KEY": "${S3_SECRET}",
    "AWS_SESSION_TOKEN": "${S3_TOKEN}",
}
SECRETS: dict[str, Any] = {
    "kafka": {"properties": {"security.protocol": "PLAINTEXT", **KAFKA_SECRETS}},
    "storage_options": {"AWS_REGION": "eu-west-1", **S3_SECRETS},
    "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "${SPARK_S3A_SECRET}"}},
}
GOOD = {"topics": ["clicks"], "schema_file": "clicks.avsc", "event_time": {"field": "ts"}}


def assert_no_canary(*texts: object) -> None:
    for text in texts:
        leaked = [name for name, canary in CANARIES.items() if canary in str(text)]
        assert not leaked, f"{', '.join(leaked)} leaked into:\n{text}"


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(out.get(key), dict) else value
    return out
