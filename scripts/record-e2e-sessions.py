#!/usr/bin/env python3
"""Records the e2e cases' sessions with real kwctl against real registries, under the hostnames
the cases use.

For each case named on the command line (default: every case whose session holds only digest
lookups on the mirror hosts below, and `examples`, the README's example), it reads the session the case holds to learn what each
registry must answer (the image there, absent, or the host down), starts a CNCF distribution
registry over TLS on a loopback address per host (the host mapped in /etc/hosts, its CA given to
kwctl with --sources-path), pushes an image of its own content for every image the mirror must
hold, runs `kwctl run --record-host-capabilities-interactions` on the case, and writes what kwctl
recorded as the case's session. The digests the registries now answer replace the old ones in
the case's request and expectations. A case whose recording asks anything else than the old
session did is reported and left as it was.

Needs: root (/etc/hosts, port 443; the block it adds is removed at exit), kwctl (KWCTL, default
`kwctl`), docker-registry, skopeo, openssl, and `make annotated-policy.wasm` done. Not run by CI
(kwctl cannot be installed there); CI replays the sessions this writes.

Usage: sudo scripts/record-e2e-sessions.py [CASE...]
"""

import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import gzip

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ROOT / "e2e" / "cases"
KWCTL = os.environ.get("KWCTL", "kwctl")
# The mirror hosts the cases name, each on a loopback address of its own.
HOSTS = {
    "mirror.example.com": "127.0.0.2",
    "eu.mirror.example.com": "127.0.0.3",
    "us.mirror.example.com": "127.0.0.4",
    "123456789012.dkr.ecr.eu-west-1.amazonaws.com": "127.0.0.5",
    # Docker Hub, as the host's client names it (docker.io -> index.docker.io).
    "index.docker.io": "127.0.0.6",
}


def served_by(image):
    """The host a lookup of `image` reaches."""
    host = image.split("/")[0]
    return "index.docker.io" if host == "docker.io" else host
MARK = "# image-swapper e2e recordings"
HEADER = ("# Recorded by real kwctl ({version}) against a CNCF distribution registry over TLS, under\n"
          "# this hostname: scripts/record-e2e-sessions.py {case}. A tookMilliseconds key (which\n"
          "# kwctl ignores) says how long that answer took far away: the rig waits as long.\n")


def run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def image_layout(directory, content):
    """An OCI layout holding one single-platform image whose layer holds `content`."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = content.encode() + b"\n"
        info = tarfile.TarInfo("content.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = layer.getvalue()
    layer_digest, layer_size = blob(gzip.compress(raw, mtime=0))
    config = {"architecture": "amd64", "os": "linux", "config": {},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]}}
    config_digest, config_size = blob(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": config_digest, "size": config_size},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": layer_digest, "size": layer_size}]}
    manifest_digest, manifest_size = blob(json.dumps(manifest).encode())
    (directory / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
         "size": manifest_size, "annotations": {"org.opencontainers.image.ref.name": "x"}}]}))
    return manifest_digest


class Rig:
    def __init__(self, work):
        self.work = work
        self.registries = {}
        ca_key, ca = work / "ca.key", work / "ca.pem"
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key,
            "-out", ca, "-days", "2", "-subj", "/CN=e2e recordings CA")
        key, csr, cert = work / "reg.key", work / "reg.csr", work / "reg.pem"
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
            "-subj", "/CN=mirror.example.com")
        (work / "ext.cnf").write_text("subjectAltName=" + ",".join(f"DNS:{h}" for h in HOSTS))
        run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
            "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", work / "ext.cnf")
        (work / "certs").mkdir()
        shutil.copy(ca, work / "certs" / "ca.crt")
        # Keyed by the name in the image too: kwctl looks up docker.io's CA as docker.io.
        (work / "sources.yml").write_text(yaml.safe_dump({"source_authorities": {
            host: [{"type": "Path", "path": str(ca)}] for host in [*HOSTS, "docker.io"]}}))
        hosts = pathlib.Path("/etc/hosts").read_text()
        block = "".join(f"{address} {host} {MARK}\n" for host, address in HOSTS.items())
        pathlib.Path("/etc/hosts").write_text(hosts + block)

    def close(self):
        self.stop()
        hosts = pathlib.Path("/etc/hosts").read_text().splitlines(keepends=True)
        pathlib.Path("/etc/hosts").write_text("".join(l for l in hosts if MARK not in l))

    def start(self, host, refusing=False):
        """A registry for `host`; `refusing`: it requires credentials kwctl does not have."""
        storage = self.work / "storage" / host
        shutil.rmtree(storage, ignore_errors=True)
        config = self.work / f"{host}.yml"
        settings = {
            "version": 0.1, "storage": {"filesystem": {"rootdirectory": str(storage)},
                                         "delete": {"enabled": True}},
            "http": {"addr": f"{HOSTS[host]}:443",
                     "tls": {"certificate": str(self.work / "reg.pem"),
                             "key": str(self.work / "reg.key")}}}
        if refusing:
            htpasswd = self.work / "htpasswd"
            # Any user will do: kwctl is given no credentials, and the registry refuses it.
            hashed = "$2b$04$cjH9.rlDtRuB.FnDCo/SpuupPXAYKHorvfOmQACZw3di4n267Ku4C"
            htpasswd.write_text(f"policy-server:{hashed}\n")
            settings["auth"] = {"htpasswd": {"realm": "registry", "path": str(htpasswd)}}
        config.write_text(yaml.safe_dump(settings))
        process = subprocess.Popen(["docker-registry", "serve", str(config)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.registries[host] = process
        for _ in range(100):
            answer = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                     "--cacert", str(self.work / "ca.pem"), f"https://{host}/v2/"],
                                    capture_output=True, text=True).stdout
            if answer in ("200", "401"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"registry for {host} did not start")

    def stop(self):
        for process in self.registries.values():
            process.terminate()
            process.wait()
        self.registries = {}

    def push(self, repository, tag, content, docker_v2=False):
        """Pushes an image of `content` as `repository:tag`, or, without a tag (the image is
        asked for by digest), under a tag of its own; as an OCI manifest, or converted to
        Docker's v2 schema 2 (the same config, another manifest digest). Its digest."""
        layout = pathlib.Path(tempfile.mkdtemp(dir=self.work))
        digest = image_layout(layout, content)
        tls = ["--dest-cert-dir", str(self.work / "certs")]
        if repository.startswith("docker.io/"):
            # skopeo sends docker.io names to Docker Hub itself: reach its stand-in by address.
            repository = HOSTS["index.docker.io"] + repository[len("docker.io"):]
            tls = ["--dest-tls-verify=false"]
        destination = f"docker://{repository}:{tag or digest.replace(':', '-')}"
        convert = ["--format", "v2s2"] if docker_v2 else []
        run("skopeo", "copy", *convert, *tls, f"oci:{layout}:x", destination)
        if docker_v2:
            inspected = run("skopeo", "inspect", "--raw",
                            *[t.replace("dest-", "") for t in tls], destination)
            digest = "sha256:" + hashlib.sha256(inspected.stdout.encode()).hexdigest()
        return digest


# Cases whose registries hold images in a relationship a session's answers cannot say: each
# seeds them itself.
def seed_verify_source_reencoded(rig):
    """The mirror holds an OCI copy of a source image served as Docker v2: same config, two
    manifest digests."""
    rig.push("mirror.example.com/dockerhub/library/nginx", "1.27", "nginx 1.27, re-encoded")
    rig.push("docker.io/library/nginx", "1.27", "nginx 1.27, re-encoded", docker_v2=True)


def seed_verify_source_stale(rig):
    """The source's tag moved on to other content since the mirror copied it."""
    rig.push("mirror.example.com/dockerhub/library/nginx", "1.27", "nginx 1.27 as it was")
    rig.push("docker.io/library/nginx", "1.27", "nginx 1.27 as it is now")


SEEDS = {
    "verify-source-reencoded": seed_verify_source_reencoded,
    "verify-source-stale": seed_verify_source_stale,
}


def split(image):
    """`host/repo:tag` -> (host/repo, tag); `host/repo[:tag]@digest` -> (host/repo, None)."""
    name = image.split("@")[0]
    last = name.rsplit("/", 1)[-1]
    repository = name.rsplit(":", 1)[0] if ":" in last else name
    return repository, (None if "@" in image else (last.split(":")[1] if ":" in last else "latest"))


def exchanges(session):
    result = []
    for exchange in yaml.safe_load(session.read_text()) or []:
        tag = exchange["request"].split("\n")[0].strip().lstrip("!")
        image = re.search(r"image: (\S+)", exchange["request"]).group(1)
        response = exchange["response"]
        if response["type"] == "Success" and tag == "OciManifestDigest":
            state = ("present", json.loads(response["payload"])["digest"])
        elif response["type"] == "Success":
            state = ("other", None)
        elif "Connection refused" in response["message"] or \
                "error sending request for url" in response["message"]:
            state = ("down", None)
        elif "Not authorized: url" in response["message"]:
            state = ("refusing", None)
        elif "OCI API error: manifest unknown]" in response["message"]:
            state = ("absent", None)
        else:
            state = ("other", None)
        result.append((tag, image, state))
    return result


def case_files(case):
    """The case's directory, request, settings, and the files that quote its digests."""
    if case == "examples":
        directory = ROOT / "examples"
        return (directory, directory / "pod.json", directory / "settings.yml",
                [directory / "pod.json", directory / "settings.yml", ROOT / "README.md"])
    directory = CASES / case
    files = [directory / "request.json", directory / "settings.yml", directory / "expect.json"]
    return directory, directory / "request.json", directory / "settings.yml", files


def recordable(case):
    session = case_files(case)[0] / "session.yml"
    found = exchanges(session) if session.exists() else []
    return case in SEEDS or bool(found) and all(
        tag == "OciManifestDigest" and served_by(image) in HOSTS and state[0] != "other"
        for tag, image, state in found)


def record(rig, case, version):
    directory, request, settings, files = case_files(case)
    old = exchanges(directory / "session.yml")
    hosts = {served_by(image) for _, image, _ in old}
    down = {served_by(image) for _, image, (state, _) in old if state == "down"}
    refusing = {served_by(image) for _, image, (state, _) in old if state == "refusing"}
    for host in sorted(hosts - down):
        rig.start(host, refusing=host in refusing)
    texts = {path: path.read_text() for path in files}
    digests = {digest: None for tag, _, (state, digest) in old
               if state == "present" and tag == "OciManifestDigest"}
    if case in SEEDS:
        SEEDS[case](rig)
    else:
        for n, (_, image, (state, digest)) in enumerate(old):
            if state == "present" and digests[digest] is None:
                repository, tag = split(image)
                digests[digest] = rig.push(repository, tag, f"{case} {n} {image}")
    for path in files:
        text = texts[path]
        for before, after in digests.items():
            text = text.replace(before, after) if after else text
        path.write_text(text)
    session = directory / "session.yml.recorded"
    output = subprocess.run(
        [KWCTL, "run", "--request-path", str(request),
         "--settings-path", str(settings),
         "--sources-path", str(rig.work / "sources.yml"),
         "--record-host-capabilities-interactions", str(session),
         str(ROOT / "annotated-policy.wasm")], capture_output=True, text=True)
    rig.stop()
    new = exchanges(session) if session.exists() else []
    if case in SEEDS:
        # The digests the registries answered, in the order the old session had its own.
        answered = [digest for tag, _, (state, digest) in new
                    if state == "present" and tag == "OciManifestDigest"]
        for before, after in zip(list(digests), answered):
            digests[before] = after
        for path in files:
            text = texts[path]
            for before, after in digests.items():
                text = text.replace(before, after) if after else text
            path.write_text(text)
    asked_before = [(tag, image) for tag, image, _ in old]
    asked_now = [(tag, image) for tag, image, _ in new]
    for before, after in digests.items():
        asked_before = [(t, i.replace(before, after) if after else i) for t, i in asked_before]
    if output.returncode != 0 or asked_now != asked_before:
        for path, text in texts.items():
            path.write_text(text)
        session.unlink(missing_ok=True)
        return f"{case}: not recorded (kwctl exit {output.returncode}; asked {asked_now}, " \
               f"the case's session asked {asked_before}): {output.stderr[-300:]}"
    recorded = session.read_text()
    session.unlink()
    # What an answer took far away (`tookMilliseconds`, which kwctl ignores and the rig waits
    # for) stays with the exchange it was written on.
    took = [e.get("tookMilliseconds") for e in yaml.safe_load((directory / "session.yml").read_text()) or []]
    parts = recorded.split("\n  response:\n")
    for index, milliseconds in enumerate(took):
        if milliseconds is not None and index < len(parts) - 1:
            parts[index] += f"\n  tookMilliseconds: {milliseconds}"
    recorded = "\n  response:\n".join(parts)
    (directory / "session.yml").write_text(HEADER.format(version=version, case=case) + recorded)
    return f"{case}: recorded, {len(new)} lookups, {len(digests)} new digests"


def main():
    cases = sys.argv[1:] or [*sorted(p.name for p in CASES.iterdir() if recordable(p.name)),
                             "examples"]
    version = run(KWCTL, "--version").stdout.strip().splitlines()[0]
    work = pathlib.Path(tempfile.mkdtemp(prefix="e2e-recordings-"))
    rig = Rig(work)
    try:
        for case in cases:
            print(record(rig, case, version))
    finally:
        rig.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
