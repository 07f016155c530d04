"""Rebuild the two extra held-out texts of headlens/data/texts (README.md says where each comes from).

    python3 make_texts.py SPARV_DIR TEXTWRAP_PY
SPARV_DIR: the `usr/share/sword/modules/texts/ztext/spaRV1909eb` folder of Debian's sword-text-sparv 2.60-1;
TEXTWRAP_PY: /usr/lib/python3.11/textwrap.py of Debian's libpython3.11-minimal 3.11.2-6+deb12u6.
"""

import re
import struct
import sys
import zlib

BOOKS = {8: "Rut", 32: "Jonás"}  # zText blocks of the Old Testament (one book a block; block 0 is the header)


def book(folder: str, block: int) -> str:
    """One book of the SWORD zText module as plain text: a blank line between chapters, OSIS markup dropped."""
    index, data = open(f"{folder}/ot.bzs", "rb").read(), open(f"{folder}/ot.bzz", "rb").read()
    offset, size, _ = struct.unpack("<III", index[12 * block : 12 * block + 12])
    osis = zlib.decompress(data[offset : offset + size]).decode("utf-8")
    osis = re.sub(r"<title[^>]*>.*?</title>", "", osis)  # the book's heading
    osis = re.sub(r"<chapter [^>]*sID[^>]*/>", "\n\n", osis)
    text = re.sub(r"<[^>]+>", "", osis)
    text = re.sub(r"[ \t]+", " ", text)
    return "\n\n".join(part.strip() for part in text.split("\n\n") if part.strip())


def main() -> None:
    folder, textwrap_py = sys.argv[1:3]
    spanish = "\n\n".join(book(folder, block) for block in BOOKS) + "\n"
    open("heldout_es.txt", "w", encoding="utf-8").write(spanish)
    open("heldout_code.txt", "w", encoding="utf-8").write(open(textwrap_py, encoding="utf-8").read())


if __name__ == "__main__":
    main()
