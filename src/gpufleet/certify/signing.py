"""Keys, signatures and the DSSE envelope, all through securesystemslib (pyca/cryptography under it): gpufleet signs
nothing with code of its own.

    keygen(KEY)                 KEY, the private key (Ed25519, PKCS#8 PEM, mode 0600), and KEY.pub, the public key
                                (SubjectPublicKeyInfo PEM): what a buyer needs
    key_signer(KEY)             securesystemslib's CryptoSigner over a key file that only its owner may read and that
                                lies outside every reports folder (refused otherwise, naming the file)
    command_signer(CMD, PUB)    a site's signing command (an HSM, a KMS): it gets the bytes to sign (DSSE's PAE) on
                                stdin and GPUFLEET_KEYID in its environment, and writes the signature on stdout, raw or
                                base64; the signature is checked against PUB before anything is written
    sign(payload, signer)       the envelope, verified with the signer's public key before it is handed back
    verified(envelope, key)     (payload, None) or (None, why): securesystemslib's own Envelope.verify

The key id is securesystemslib's default (the SHA-256 of the public key's canonical JSON): a buyer who loads the
public key with securesystemslib gets the same id, which DSSE's verify matches against the signature's.
"""

from __future__ import annotations

import base64
import binascii
import copy
import os
import shlex
import subprocess
from pathlib import Path

from gpufleet.base import paths
from gpufleet.base.certificates import PAYLOAD_TYPE
from gpufleet.base.errors import InputError

KEY_MODE = 0o600
PUBLIC_SUFFIX = ".pub"
COMMAND_TIMEOUT_S = 60
MISSING = "securesystemslib with pyca/cryptography is not installed in this Python ({why}): pip install 'gpufleet[certificate]'"


def library():
    """securesystemslib's DSSE, signer and key modules and cryptography's serialization (imported here: a controller
    without the certificate extra runs every other command); InputError saying what to install."""
    try:
        from cryptography.hazmat.primitives import serialization
        from securesystemslib import dsse, exceptions, signer
    except ImportError as exc:
        raise InputError(MISSING.format(why=exc)) from None
    return dsse, signer, exceptions, serialization


def _inside_reports(path: Path, reports_dirs) -> Path | None:
    real = path.resolve()
    for folder in reports_dirs:
        root = Path(folder).resolve()
        if real == root or root in real.parents:
            return root
    return None


def check_key_file(key: str | Path, reports_dirs, what: str = "--key (gpufleet_certify_key)") -> Path:
    """The private key file, when only its owner may read it and it lies outside the reports folders (a run's folder,
    an artifact or an evidence bundle is made from them); InputError naming the file otherwise."""
    path = Path(key)
    if not path.is_file():
        raise InputError(f"{what} {path} is not a file; expected the private key `gpufleet keygen` wrote")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InputError(
            f"{what} {path} has mode {mode:04o}: a private key must be readable by its owner alone "
            f"(0600); run `chmod 600 {shlex.quote(str(path))}`"
        )
    root = _inside_reports(path, reports_dirs)
    if root is not None:
        raise InputError(
            f"{what} {path} lies inside the reports folder {root}, whose runs are copied into artifacts and evidence "
            "bundles: keep the private key outside it (e.g. ~/.config/gpufleet/) and point to it there"
        )
    return path


def public_key(path: str | Path, what: str = "--pubkey"):
    """securesystemslib's key of a public key PEM file; InputError naming the file."""
    _, signer, _, serialization = library()
    pem, why = paths.read_bytes(path, follow=True)  # never waits on a FIFO
    if pem is None:
        raise InputError(f"{what} {path} {why}; give the KEY.pub `gpufleet keygen` wrote, readable to this user")
    try:
        return signer.SSlibKey.from_crypto(serialization.load_pem_public_key(pem))
    except (ValueError, TypeError) as exc:
        raise InputError(
            f"{what} {path} is not a public key in PEM (SubjectPublicKeyInfo): {exc}; expected the KEY.pub "
            "`gpufleet keygen` wrote"
        ) from None


def keygen(key: str | Path, reports_dirs) -> dict:
    """KEY (0600) and KEY.pub, neither overwritten; {"key", "pubkey", "keyid"}."""
    _, signer, _, serialization = library()
    path, pub = Path(key), Path(f"{key}{PUBLIC_SUFFIX}")
    root = _inside_reports(path, reports_dirs)
    if root is not None:
        raise InputError(
            f"{path} lies inside the reports folder {root}, whose runs are copied into artifacts and evidence "
            "bundles: write the private key outside it"
        )
    for existing in (path, pub):
        if existing.exists():
            raise InputError(f"{existing} exists; a key is never overwritten: name another file, or move it aside")
    made = signer.CryptoSigner.generate_ed25519()
    paths.make_dir(path.parent)
    try:  # created with its mode: never readable by others, not even for a moment
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_MODE)
    except OSError as exc:
        raise InputError(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(made.private_bytes)
    private = serialization.load_pem_private_key(made.private_bytes, password=None)
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    paths.write_atomic(pub, pem.decode("ascii"), mode=0o644)
    return {"key": str(path), "pubkey": str(pub), "keyid": made.public_key.keyid}


def key_signer(key: str | Path, reports_dirs):
    """A CryptoSigner over the key file (check_key_file first)."""
    _, signer, _, serialization = library()
    path = check_key_file(key, reports_dirs)
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        return signer.CryptoSigner(private)
    except (ValueError, TypeError) as exc:
        raise InputError(
            f"--key (gpufleet_certify_key) {path} is not an unencrypted private key in PEM (PKCS#8): {exc}; expected "
            "the key `gpufleet keygen` wrote, or a signing command (gpufleet_certify_command)"
        ) from None


def _signature_bytes(out: bytes) -> bytes:
    """The signature a command wrote: base64 text when it decodes as such, else the raw bytes."""
    text = out.strip()
    try:
        return base64.b64decode(text, validate=True) if text else b""
    except (binascii.Error, ValueError):
        return out


def command_signer(command: str, pubkey: str | Path):
    """A securesystemslib Signer that runs the site's command (the module docstring) for each signature."""
    dsse, signer, exceptions, _ = library()
    key = public_key(pubkey, "--pubkey (gpufleet_certify_pubkey)")
    argv = shlex.split(command)
    if not argv:
        raise InputError("--sign-command (gpufleet_certify_command) is empty; expected a command line")

    class CommandSigner(signer.Signer):
        @classmethod
        def from_priv_key_uri(cls, priv_key_uri, public_key, secrets_handler=None):
            raise NotImplementedError("a signing command is given by its command line")

        @property
        def public_key(self):
            return key

        def sign(self, payload: bytes):
            try:
                done = subprocess.run(
                    argv,
                    input=payload,
                    capture_output=True,
                    timeout=COMMAND_TIMEOUT_S,
                    env=dict(os.environ, GPUFLEET_KEYID=key.keyid),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise InputError(f"--sign-command (gpufleet_certify_command) {argv[0]} could not run: {exc}") from None
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip()[-500:]
                raise InputError(
                    f"--sign-command (gpufleet_certify_command) exited {done.returncode}: {tail or 'no message'}"
                )
            sig = signer.Signature(key.keyid, _signature_bytes(done.stdout).hex())
            try:
                key.verify_signature(sig, payload)
            except exceptions.UnverifiedSignatureError:
                raise InputError(
                    "--sign-command (gpufleet_certify_command) wrote a signature that --pubkey "
                    "(gpufleet_certify_pubkey) does not verify: the command signs with another key, or writes more "
                    "than the signature (expected the signature alone, raw or base64, on stdout)"
                ) from None
            return sig

    return CommandSigner()


def signer_of(key: str | None, command: str | None, pubkey: str | None, reports_dirs):
    """The signer a command's options name (--key, or --sign-command with --pubkey); InputError otherwise."""
    if bool(key) == bool(command):
        raise InputError("give --key KEY (gpufleet_certify_key) or --sign-command CMD (gpufleet_certify_command), one")
    if key:
        return key_signer(key, reports_dirs)
    if not pubkey:
        raise InputError(
            "--sign-command needs --pubkey (gpufleet_certify_pubkey): the public key of the key it signs with"
        )
    return command_signer(command, pubkey)


def sign(payload: bytes, signer) -> dict:
    """The DSSE envelope of payload, signed; verified with the signer's public key before it is handed back."""
    dsse, _, _, _ = library()
    envelope = dsse.Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(signer)
    envelope.verify([signer.public_key], 1)
    return envelope.to_dict()


def verified(envelope: dict, key) -> tuple[bytes | None, str | None]:
    """(the payload, None) when securesystemslib's Envelope.verify accepts the envelope with `key`; else (None, why)."""
    dsse, _, exceptions, _ = library()
    if not isinstance(envelope, dict) or not {"payload", "payloadType", "signatures"} <= set(envelope):
        return None, "not a DSSE envelope (expected payload, payloadType and signatures)"
    try:  # from_dict changes the signatures it is given: a copy
        env = dsse.Envelope.from_dict(copy.deepcopy(envelope))
    except (KeyError, TypeError, ValueError, binascii.Error, exceptions.FormatError) as exc:
        return None, f"the envelope cannot be read: {type(exc).__name__}: {exc}"
    if env.payload_type != PAYLOAD_TYPE:
        return None, f"payloadType is {env.payload_type!r}, not {PAYLOAD_TYPE}"
    if key.keyid not in env.signatures:
        return (
            None,
            f"no signature by key {key.keyid[:16]}… (signed by {', '.join(k[:16] + '…' for k in env.signatures) or 'nobody'})",
        )
    try:
        env.verify([key], 1)
    except exceptions.VerificationError:
        return None, f"the signature of key {key.keyid[:16]}… does not verify: the payload or the signature was changed"
    return env.payload, None
