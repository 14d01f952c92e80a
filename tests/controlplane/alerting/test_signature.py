"""verify_signature: HMAC-SHA256 over `timestamp.body`, stale timestamps rejected, two secrets during rotation."""
from controlplane.alerting.webhooks.signing import sign, verify_signature

BODY = b'{"event":"firing"}'
NOW = 1_800_000_000


def test_a_signature_made_with_the_secret_verifies():
    header = sign(BODY, ["s3cret-current-0123"], timestamp=NOW)
    assert verify_signature(header, BODY, ["s3cret-current-0123"], now=NOW + 10)


def test_a_changed_body_or_another_secret_fails():
    header = sign(BODY, ["s3cret-current-0123"], timestamp=NOW)
    assert not verify_signature(header, BODY + b" ", ["s3cret-current-0123"], now=NOW)
    assert not verify_signature(header, BODY, ["another-secret-4567"], now=NOW)


def test_a_stale_or_future_timestamp_fails():
    header = sign(BODY, ["s3cret-current-0123"], timestamp=NOW)
    assert not verify_signature(header, BODY, ["s3cret-current-0123"], tolerance_s=300, now=NOW + 301)
    assert not verify_signature(header, BODY, ["s3cret-current-0123"], tolerance_s=300, now=NOW - 301)


def test_during_a_rotation_either_secret_verifies():
    header = sign(BODY, ["new-secret-abcdef01", "old-secret-23456789"], timestamp=NOW)
    assert header.count("v1=") == 2
    assert verify_signature(header, BODY, ["old-secret-23456789"], now=NOW)
    assert verify_signature(header, BODY, ["new-secret-abcdef01"], now=NOW)


def test_a_malformed_header_fails():
    for header in (None, "", "garbage", "t=abc,v1=00", "v1=00", f"t={NOW}", f"t={NOW},v1"):
        assert not verify_signature(header, BODY, ["s3cret-current-0123"], now=NOW)
