"""The catalog test vector, also in docs/wire-format.md ("Naming and catalog"): tokens 1..5
in chunks of 4, tracks int8 (no tables) and ac (tables 01 02 03), chunk 0 encoded, chunk 1
not yet."""

from __future__ import annotations

from sidecar.kvcache.catalog import Catalog
from sidecar.kvcache.layout import KVLayout

VECTOR_LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4)
VECTOR_INT8_CHUNK0 = [b"\x01\x02"] * 4
VECTOR_AC_CHUNK0 = [b"\x01", b"\x02", b"\x03", b"\x04"]
VECTOR_BYTES = (
    b'{"chunk_hashes":"lvJq68aIb8I2ImIvijsGxkST/BEPxxiSU58n/3mpCycDqqfQZv3cX0gCTpPUjCPNtmKYwwLqF79S'
    b'7ejMS/yEsg==","chunk_size":4,"layout":{"dtype":"float16","head_dim":4,"num_kv_heads":1,'
    b'"num_layers":2},"model":"demo/model","token_count":5,"tracks":{"ac":{"digests":'
    b'"93y558OWjRf5r+QUO1pd8Bjt7fh4Qb4jq86GbmQRRcw=","sizes":[4],"tables":"AQID"},"int8":'
    b'{"digests":"yrxnJudeWaaw7+46Xu3kTmgdYt6gY0xvygG6VFfwI+o=","sizes":[8],"tables":null}},'
    b'"version":1}'
)


def vector_first_revision() -> Catalog:
    return Catalog.for_prompt(
        "demo/model", VECTOR_LAYOUT, [1, 2, 3, 4, 5], {"int8": None, "ac": b"\x01\x02\x03"}, 4
    )


def vector_catalog() -> Catalog:
    return vector_first_revision().with_chunk({"int8": VECTOR_INT8_CHUNK0, "ac": VECTOR_AC_CHUNK0})
