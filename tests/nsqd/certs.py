"""Test certificates, made at run time with `cryptography` (none is committed):
a CA, a server certificate for 127.0.0.1/localhost signed by it, a client
certificate signed by it (CN "client-ok") and a self-signed client
certificate (CN "stranger") that the CA does not vouch for."""

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path, key, cert):
    with open(path + ".key", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    with open(path + ".pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def _cert(subject, key, issuer, issuer_key, *, ca=False, san=None, usage=None):
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=30))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                          crl_sign=True, content_commitment=False,
                                          key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                            critical=False)
    else:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            issuer_key.public_key()), critical=False)
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_certs(directory):
    """Write ca, server, client and stranger .pem/.key files; returns their
    paths without extension, by name."""
    os.makedirs(directory, exist_ok=True)
    paths = {n: os.path.join(directory, n) for n in ("ca", "server", "client", "stranger")}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("nsqshm test CA", ca_key, "nsqshm test CA", ca_key, ca=True)
    _write(paths["ca"], ca_key, ca)
    key = ec.generate_private_key(ec.SECP256R1())
    _write(paths["server"], key, _cert(
        "127.0.0.1", key, "nsqshm test CA", ca_key,
        san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
        usage=[ExtendedKeyUsageOID.SERVER_AUTH]))
    key = ec.generate_private_key(ec.SECP256R1())
    _write(paths["client"], key, _cert("client-ok", key, "nsqshm test CA", ca_key,
                                       usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))
    key = ec.generate_private_key(ec.SECP256R1())
    _write(paths["stranger"], key, _cert("stranger", key, "stranger", key,
                                         usage=[ExtendedKeyUsageOID.CLIENT_AUTH]))
    return paths
