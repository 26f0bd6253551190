#!/usr/bin/env python3
"""A minimal OpenID Connect issuer for the test control plane: serves, over HTTPS, the discovery document
and the JWKS of one RSA signing key, which the API server's JWT authenticator (--authentication-config)
fetches. Tokens are signed by the tests themselves with the same key (crates/fleetroll-testkit/src/people.rs).

  oidc-issuer.py ADDRESS PORT CERT KEY SIGNING_KEY_MODULUS_HEX
"""
import base64
import http.server
import json
import ssl
import sys


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main() -> None:
    address, port, cert, key, modulus_hex = sys.argv[1:6]
    issuer = f"https://{address}:{port}"
    modulus = bytes.fromhex(modulus_hex)
    jwk = {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "testenv", "n": b64url(modulus), "e": "AQAB"}
    documents = {
        "/.well-known/openid-configuration": {
            "issuer": issuer,
            "jwks_uri": f"{issuer}/jwks",
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
        },
        "/jwks": {"keys": [jwk]},
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            document = documents.get(self.path)
            body = json.dumps(document).encode() if document else b"not found"
            self.send_response(200 if document else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write("oidc-issuer: " + (format % args) + "\n")

    server = http.server.ThreadingHTTPServer((address, int(port)), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
