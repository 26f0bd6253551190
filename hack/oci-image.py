#!/usr/bin/env python3
"""Writes a container image as an OCI image layout, without a container engine, byte for byte the same for
the same inputs.

    oci-image.py --out DIR --tag TAG --file SRC=DEST [--file ...] [--entrypoint ARG ...] [--cmd ARG ...]
                 [--user UID:GID] [--port PORT/tcp ...] [--label KEY=VALUE ...] [--epoch SECONDS]
                 [--sbom-cargo MANIFEST --sbom-target TRIPLE] [--provenance KEY=VALUE ...]

One layer holds the files (owned by root, mode 0755, dated --epoch); the config carries the entrypoint, the
user, the exposed ports and the labels. With --sbom-cargo and --provenance the image also carries what
BuildKit attaches with `--sbom --provenance`: an attestation manifest beside the platform's, whose layers
are in-toto statements about it, an SPDX 2.3 document of the crates the binary is built from (Cargo.lock's
normal dependencies of the package, for the target) and a SLSA v1 provenance. Nothing depends on the time
of the build: `created` and every date is --epoch (the commit's time), so a rebuild of the same binary at
the same commit gives the same digests.

Prints the digest of the image index (what to pin: `repository@sha256:...`) and writes it to DIR/digest.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from datetime import datetime, timezone

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
IN_TOTO = "application/vnd.in-toto+json"
SPDX = "https://spdx.dev/Document"
SLSA = "https://slsa.dev/provenance/v1"


def fail(message):
    print(f"oci-image: {message}", file=sys.stderr)
    sys.exit(1)


def canonical(value):
    """JSON as the blob's bytes: sorted keys, no spaces, so equal content has one digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class Layout:
    """An OCI image layout being written: blobs by digest under blobs/sha256."""

    def __init__(self, out):
        if os.path.exists(out):
            shutil.rmtree(out)
        os.makedirs(os.path.join(out, "blobs", "sha256"))
        self.out = out

    def blob(self, data, media_type, **extra):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(self.out, "blobs", "sha256", digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}

    def finish(self, index, tag):
        with open(os.path.join(self.out, "oci-layout"), "wb") as f:
            f.write(canonical({"imageLayoutVersion": "1.0.0"}))
        entry = dict(index, annotations={"org.opencontainers.image.ref.name": tag})
        with open(os.path.join(self.out, "index.json"), "wb") as f:
            f.write(canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}))


def layer(files, epoch):
    """A gzipped tar of (source, destination) files and the directories above them; returns (gzip, tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        dirs = sorted({os.path.dirname(dest.lstrip("/")) for _, dest in files} - {""})
        made = set()
        for d in dirs:
            parts = d.split("/")
            for n in range(1, len(parts) + 1):
                path = "/".join(parts[:n])
                if path not in made:
                    made.add(path)
                    info = tarfile.TarInfo(path + "/")
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
                    tar.addfile(info)
        for src, dest in sorted(files, key=lambda f: f[1]):
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755, epoch
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=packed, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(tar_bytes)
    return packed.getvalue(), tar_bytes


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def spdx_license(value):
    """Cargo's license field as an SPDX expression (old crates write `MIT/Apache-2.0`)."""
    if not value:
        return "NOASSERTION"
    return " OR ".join(part.strip() for part in value.split("/"))


def cargo_sbom(manifest, target, name, version, created, namespace):
    """The SPDX 2.3 document of the crates `cargo build --target TARGET` links into the package's binary."""
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--locked", "--format-version", "1", "--manifest-path", manifest,
             "--filter-platform", target],
            check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        fail(f"cargo metadata failed: {e.stderr.strip()}")
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next((p["id"] for p in meta["packages"] if p["name"] == name and p["source"] is None), None)
    if root is None:
        fail(f"no package {name} in {manifest}")
    with open(os.path.join(os.path.dirname(manifest), "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock.get("package", [])}

    # The normal dependencies, transitively: build scripts' and tests' crates are not in the binary.
    seen, stack, edges = {root}, [root], []
    while stack:
        node = nodes[stack.pop()]
        for dep in node["deps"]:
            if not any(k["kind"] is None for k in dep["dep_kinds"]):
                continue
            edges.append((node["id"], dep["pkg"]))
            if dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])

    def spdx_id(pkg_id):
        p = packages[pkg_id]
        return "SPDXRef-Package-" + "".join(c if c.isalnum() or c in ".-" else "-" for c in f"{p['name']}-{p['version']}")

    entries = []
    for pkg_id in sorted(seen, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        p = packages[pkg_id]
        entry = {
            "SPDXID": spdx_id(pkg_id), "name": p["name"], "versionInfo": p["version"],
            "downloadLocation": (f"https://crates.io/api/v1/crates/{p['name']}/{p['version']}/download"
                                 if p["source"] and p["source"].startswith("registry+") else "NOASSERTION"),
            "licenseConcluded": "NOASSERTION", "licenseDeclared": spdx_license(p.get("license")),
            "copyrightText": "NOASSERTION", "filesAnalyzed": False,
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}"}],
        }
        checksum = checksums.get((p["name"], p["version"]))
        if checksum:
            entry["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
        entries.append(entry)
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": spdx_id(root)}]
    relationships += [{"spdxElementId": spdx_id(a), "relationshipType": "DEPENDS_ON",
                       "relatedSpdxElement": spdx_id(b)} for a, b in sorted(set(edges))]
    return {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{name}-{version}", "documentNamespace": namespace,
        "creationInfo": {"created": created, "creators": ["Tool: fleetroll-hack-oci-image"]},
        "packages": entries, "relationships": relationships,
    }


def statement(predicate_type, predicate, subject):
    return {"_type": "https://in-toto.io/Statement/v0.1", "predicateType": predicate_type,
            "subject": [subject], "predicate": predicate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", required=True, help="the layout's ref name, e.g. 0.1.0")
    ap.add_argument("--name", default="image", help="the image's name, for the attestations' subject")
    ap.add_argument("--file", action="append", default=[], required=True, metavar="SRC=DEST")
    ap.add_argument("--entrypoint", nargs="+", default=[])
    ap.add_argument("--cmd", nargs="+", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--port", action="append", default=[])
    ap.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    ap.add_argument("--sbom-cargo", metavar="CARGO_TOML")
    ap.add_argument("--sbom-target", default="x86_64-unknown-linux-musl")
    ap.add_argument("--sbom-package", default="fleetroll")
    ap.add_argument("--provenance", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    files = []
    for spec in args.file:
        src, sep, dest = spec.partition("=")
        if not sep or not dest.startswith("/"):
            fail(f"--file {spec!r}: expected SRC=/DEST")
        if not os.path.isfile(src):
            fail(f"--file {spec!r}: {src} is not a file")
        files.append((src, dest))
    labels = dict(label.split("=", 1) for label in args.label)
    created = datetime.fromtimestamp(args.epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    out = Layout(args.out)
    gz, tar = layer(files, args.epoch)
    layer_desc = out.blob(gz, OCI_LAYER)
    config = {
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {k: v for k, v in {
            "Entrypoint": args.entrypoint or None, "Cmd": args.cmd or None, "User": args.user or None,
            "ExposedPorts": {p: {} for p in args.port} or None, "Labels": labels or None,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        }.items() if v is not None},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
        "history": [{"created": created, "created_by": "hack/oci-image.py", "comment": "the files"}],
    }
    config_desc = out.blob(canonical(config), OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc, "layers": [layer_desc],
                "annotations": {k: v for k, v in labels.items() if k.startswith("org.opencontainers.image.")}}
    platform = {"architecture": "amd64", "os": "linux"}
    manifest_desc = out.blob(canonical(manifest), OCI_MANIFEST, platform=platform)
    manifests = [manifest_desc]

    if args.sbom_cargo or args.provenance:
        version = labels.get("org.opencontainers.image.version", "0")
        subject = {"name": f"pkg:docker/{args.name}@{args.tag}?platform=linux%2Famd64",
                   "digest": {"sha256": manifest_desc["digest"].removeprefix("sha256:")}}
        layers, diff_ids = [], []
        if args.sbom_cargo:
            namespace = f"https://fleetroll.dev/spdx/{args.name}/{manifest_desc['digest']}"
            doc = cargo_sbom(os.path.abspath(args.sbom_cargo), args.sbom_target, args.sbom_package, version,
                             created, namespace)
            blob = canonical(statement(SPDX, doc, subject))
            layers.append(out.blob(blob, IN_TOTO, annotations={"in-toto.io/predicate-type": SPDX}))
            diff_ids.append(f"sha256:{hashlib.sha256(blob).hexdigest()}")
        if args.provenance:
            facts = dict(p.split("=", 1) for p in args.provenance)
            predicate = {
                "buildDefinition": {
                    "buildType": "https://fleetroll.dev/make-image/v1",
                    "externalParameters": {k: facts[k] for k in ("source", "target", "profile") if k in facts},
                    "internalParameters": {k: v for k, v in facts.items()
                                           if k not in ("source", "target", "profile", "revision")},
                    "resolvedDependencies": [{"uri": facts.get("source", ""),
                                              "digest": {"gitCommit": facts.get("revision", "")}}],
                },
                "runDetails": {
                    "builder": {"id": "https://fleetroll.dev/make-image"},
                    "metadata": {"startedOn": created, "finishedOn": created},
                    "byproducts": [{"name": dest, "digest": {"sha256": sha256_file(src)}} for src, dest in files],
                },
            }
            blob = canonical(statement(SLSA, predicate, subject))
            layers.append(out.blob(blob, IN_TOTO, annotations={"in-toto.io/predicate-type": SLSA}))
            diff_ids.append(f"sha256:{hashlib.sha256(blob).hexdigest()}")
        att_config = out.blob(canonical({"architecture": "unknown", "os": "unknown", "config": {},
                                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}), OCI_CONFIG)
        attestation = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": att_config, "layers": layers}
        manifests.append(out.blob(
            canonical(attestation), OCI_MANIFEST, platform={"architecture": "unknown", "os": "unknown"},
            annotations={"vnd.docker.reference.digest": manifest_desc["digest"],
                         "vnd.docker.reference.type": "attestation-manifest"}))

    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    index_desc = out.blob(canonical(index), OCI_INDEX)
    out.finish(index_desc, args.tag)
    with open(os.path.join(args.out, "digest"), "w") as f:
        f.write(index_desc["digest"] + "\n")
    print(index_desc["digest"])


if __name__ == "__main__":
    main()
