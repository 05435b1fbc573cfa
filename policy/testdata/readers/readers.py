"""readers.py answers, for policy's TestPathReaders, which of Python's ways
of comparing text without case take two paths for the same; the protocol
is Readers.java's."""
import re
import sys
import unicodedata


def nfkc_casefold(s):
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold())


MAPPINGS = {
    "python str.casefold": str.casefold,
    "python str.lower": str.lower,
    "python str.upper": str.upper,
    "python NFKC and casefold": nfkc_casefold,
}

out = []
rows = sys.stdin.buffer.read().decode("utf-8").split("\n")
for i, line in enumerate(rows):
    if not line:
        continue
    rule, s = line.split("\t")
    for reader, f in MAPPINGS.items():
        if f(rule) == f(s):
            out.append(f"row\t{i}\t{reader}")
    if re.fullmatch(re.escape(rule), s, re.IGNORECASE):
        out.append(f"row\t{i}\tpython re.IGNORECASE")

ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
ANY = re.compile("[a-z0-9]", re.IGNORECASE)
for cp in range(0x80, 0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    if ANY.fullmatch(c):
        for x in ALNUM:
            if re.fullmatch(x, c, re.IGNORECASE):
                out.append(f"char\tpython re.IGNORECASE\t{cp:x}\t{x}")
    for reader, f in MAPPINGS.items():
        img = f(c)
        if img.isascii():
            out.append(f"char\t{reader}\t{cp:x}\t{img}")
sys.stdout.buffer.write(("\n".join(out) + "\n").encode("utf-8"))
