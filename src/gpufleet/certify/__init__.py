"""Acceptance certificates: what the judge decided about a node, bound to its hardware, signed (docs/certificates.md).

It sits above the report: it reads report.json and the host documents and nothing below imports it (what the
report, `gpufleet status` and the sweeps read of a certificate, unverified, is base/certificates.py).

signing.py    keys, the signing command, the DSSE envelope: securesystemslib's, never a signing of our own
statement.py  a node's in-toto Statement (its subjects: the board and each GPU) and the fleet's
issue.py      `gpufleet certify RUN_DIR`: each accepted node's certificate, the fleet's, the expiry for Prometheus
verify.py     `gpufleet verify CERT`: the signature, the form, the time, the hardware (a document, or --live)
"""
