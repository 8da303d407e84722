#!/usr/bin/env python3
"""Which kernels' machine code an edit changed: compares the `.text.<kernel>` sections of the
cubins embedded in two CUDA object files (before and after), kernel by kernel.

    python3 tools/cubin_text_hashes.py before.o after.o [--rename REGEX=REPLACEMENT ...]

Each object's `.nv_fatbin` is extracted with objcopy; every ELF image in it (magic \\x7fELF) is
read and each `.text.*` section hashed (SHA-256) under its name, with anonymous-namespace
prefixes (`_GLOBAL__N__<hex>_`) made equal. Prints the counts of unchanged, changed, removed and
new kernels and names the last three kinds. --rename rewrites the before object's kernel names
(re.sub), for an edit that renamed kernels without meaning to change their code: a template that
gained a defaulted parameter, say `--rename 'StepNILi(\d)EE=StepNILi\1ELb0EE'`. Compile both objects with `--compress-mode=none`
(nvcc 13 may compress a large fatbin, and then no ELF image is visible): the command that
`ninja -t commands <object>` prints, plus that flag and another `-o`.
"""
import hashlib
import re
import struct
import subprocess
import sys
import tempfile


def cubins(obj):
    """The sections {name: bytes} of every ELF image in the object's .nv_fatbin."""
    with tempfile.NamedTemporaryFile(suffix=".fatbin") as f:
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", obj, f.name], check=True)
        data = open(f.name, "rb").read()
    images = []
    i = data.find(b"\x7fELF")
    while i >= 0:
        shoff, = struct.unpack_from("<Q", data, i + 0x28)  # ELF64: section headers
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, i + 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", data, i + shoff + s * shentsize) for s in range(shnum)]
        names_at = i + headers[shstrndx][4]
        sections = {}
        for name, kind, _flags, _addr, offset, size in headers:
            start = names_at + name
            label = data[start:data.index(b"\0", start)].decode()
            sections[label] = b"" if kind == 8 else data[i + offset:i + offset + size]  # 8: SHT_NOBITS
        images.append(sections)
        i = data.find(b"\x7fELF", i + max(shoff + shentsize * shnum, 4))
    return images


def text_hashes(obj):
    table = {}
    for image in cubins(obj):
        for name, body in image.items():
            if name.startswith(".text."):
                table[re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__X_", name)] = hashlib.sha256(body).hexdigest()[:16]
    return table


def main():
    args = sys.argv[1:]
    renames = []
    while "--rename" in args:
        k = args.index("--rename")
        if k + 1 >= len(args) or "=" not in args[k + 1]:
            sys.exit("--rename takes REGEX=REPLACEMENT\n\n" + __doc__)
        renames.append(args[k + 1].split("=", 1))
        del args[k:k + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    before, after = text_hashes(args[0]), text_hashes(args[1])
    for pattern, replacement in renames:
        before = {re.sub(pattern, replacement, n): h for n, h in before.items()}
    changed = [n for n in before if n in after and before[n] != after[n]]
    removed = [n for n in before if n not in after]
    new = [n for n in after if n not in before]
    print(f"kernels before {len(before)}, after {len(after)}: unchanged {len(before) - len(changed) - len(removed)}, "
          f"changed {len(changed)}, removed {len(removed)}, new {len(new)}")
    for kind, names in (("changed", changed), ("removed", removed), ("new", new)):
        for n in names:
            print(kind, n)
    if not before or not after:
        print("no .text section found: is a fatbin compressed? (compile with --compress-mode=none)")


if __name__ == "__main__":
    main()
