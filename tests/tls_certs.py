"""Test certificates made at run time with the openssl command: a CA and a server for 127.0.0.1.

Made the way docs/deployment.md tells operators to make them (its step 2), so
the tests also check those commands. Keys are EC P-256: generated in milliseconds.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_EXTENSIONS = """\
subjectAltName=IP:127.0.0.1
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
"""


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA certificate clients trust
    cert: Path  # the server certificate, for IP 127.0.0.1, signed by the CA
    key: Path
    other_ca: Path  # a CA that signed nothing here: trusting it alone must fail


def openssl(*args: str | Path) -> None:
    binary = shutil.which("openssl")
    assert binary, "the TLS tests need the openssl command line tool (apt-get install openssl)"
    done = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {args[0]} failed:\n{done.stderr}"


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "2", "-subj", f"/CN={name}", "-keyout", key, "-out", cert,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca(folder, "trainer-ca")
    other_ca, _ = make_ca(folder, "other-ca")
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", "/CN=trainer server", "-keyout", key, "-out", csr)
    extensions = folder / "server.ext"
    extensions.write_text(SERVER_EXTENSIONS)
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-days", "2", "-extfile", extensions, "-out", cert)
    return Certs(ca=ca, cert=cert, key=key, other_ca=other_ca)
