"""How the local stack runs DynamoDB Local's JVM: quick to boot, with a class data archive cached.

Most of a JVM's boot is loading and verifying the same few thousand classes. A class data sharing
(AppCDS) archive holds them ready, and a boot that maps it takes about a third of the CPU and time. A
JVM started without one lists the classes it loads; once it has stopped, a background process (niced,
detached: nobody waits for it) dumps the archive from that list, for every later start. The archive is
cached under build/dynamodb-local/, keyed by what it depends on (the JVM, its options, the jars), so a
new Java or a new DynamoDB Local makes a new one. An archive needs a class path without directories,
and DynamoDBLocal.jar's manifest names its own folder: the JVM runs a copy of the jar whose manifest
names only the main class, with the manifest's jars on the command line instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

BUILD_DIR: Final = Path("build") / "dynamodb-local"
# The quick compiler alone, with one garbage collector thread: on two busy cores the optimising
# compiler's work never pays back in a local run or a test process. Measured on this kind of machine
# (bench/results.md, "Developer loop"): boot, the first requests and thousands after them all take
# about half the time and half the CPU.
JVM_OPTIONS: Final = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
ARCHIVE: Final = "classes.jsa"
# A background dump takes tens of seconds of CPU; one still "building" after this long has died.
BUILD_TIMEOUT_SECONDS: Final = 900
_launches = itertools.count()
_MANIFEST: Final = "META-INF/MANIFEST.MF"


def _manifest(jar: Path) -> dict[str, str]:
    with zipfile.ZipFile(jar) as archive:
        text = archive.read(_MANIFEST).decode("utf-8")
    # Continuation lines start with one space (the JAR manifest format).
    fields: dict[str, str] = {}
    for line in text.replace("\r\n", "\n").replace("\n ", "").splitlines():
        name, _, value = line.partition(": ")
        if value:
            fields[name] = value
    return fields


def _key(java: Path, jar_dir: Path, jars: list[Path]) -> str:
    digest = hashlib.sha256(repr(JVM_OPTIONS).encode())
    for path in (java, *jars):
        status = path.stat()
        digest.update(f"{path}:{status.st_size}:{status.st_mtime_ns}".encode())
    digest.update(str(jar_dir).encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Launch:
    """The command line of one DynamoDB Local, and the class list it writes when there is no archive."""

    argv: list[str]
    java: str
    class_path: str
    archive: Path
    class_list: Path | None  # where the JVM lists the classes it loads (None: it maps the archive)

    def build_archive(self) -> None:
        """After the JVM stopped: dump the archive from its class list in a detached background process,
        unless one is there or being built (a build older than BUILD_TIMEOUT_SECONDS has died)."""
        if self.class_list is None or not self.class_list.is_file() or self.archive.is_file():
            return
        lock = self.archive.with_suffix(".building")
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > BUILD_TIMEOUT_SECONDS:
                lock.unlink()
        try:
            lock.touch(exist_ok=False)
        except FileExistsError:
            self.class_list.unlink(missing_ok=True)
            return
        staging = self.archive.with_suffix(f".{os.getpid()}.tmp")
        dump = [self.java, *JVM_OPTIONS, "-Xshare:dump", f"-XX:SharedClassListFile={self.class_list}"]
        dump += [f"-XX:SharedArchiveFile={staging}", "-cp", self.class_path]
        script = 'nice -n 10 "$@" && mv -f "$STAGING" "$ARCHIVE"; rm -f "$STAGING" "$LIST" "$LOCK"'
        files = {"STAGING": staging, "ARCHIVE": self.archive, "LIST": self.class_list, "LOCK": lock}
        subprocess.Popen(  # noqa: S603 - our own command line
            ["/bin/sh", "-c", script, "sh", *dump],
            env={**os.environ, **{name: str(path) for name, path in files.items()}},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def launch(root: Path, java: str, jar_dir: Path, arguments: list[str]) -> Launch:
    """DynamoDB Local's command line: with the cached class archive, or listing its classes for one."""
    original = jar_dir / "DynamoDBLocal.jar"
    fields = _manifest(original)
    jars = [original] + [
        jar_dir / entry for entry in fields.get("Class-Path", "").split() if entry.endswith(".jar")
    ]
    java_path = Path(shutil.which(java) or java).resolve()
    cache = root / BUILD_DIR / _key(java_path, jar_dir, jars)
    runner = cache / "DynamoDBLocal.jar"
    if not runner.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        staging = runner.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(original) as source, zipfile.ZipFile(staging, "w") as copy:
            for item in source.infolist():
                data = source.read(item.filename)
                if item.filename == _MANIFEST:
                    data = f"Manifest-Version: 1.0\nMain-Class: {fields['Main-Class']}\n\n".encode()
                copy.writestr(item, data)
        os.replace(staging, runner)
    archive = cache / ARCHIVE
    class_list: Path | None = None
    if archive.is_file():
        sharing = f"-XX:SharedArchiveFile={archive}"
    else:
        class_list = cache / f"classes.{os.getpid()}-{next(_launches)}.lst"
        sharing = f"-XX:DumpLoadedClassList={class_list}"
    class_path = os.pathsep.join(str(jar) for jar in [runner, *jars[1:]])
    library = f"-Djava.library.path={jar_dir / 'DynamoDBLocal_lib'}"
    argv = [java, *JVM_OPTIONS, sharing, library, "-cp", class_path, fields["Main-Class"], *arguments]
    return Launch(argv, java, class_path, archive, class_list)
