"""Machine-check events in the kernel log, with the bank and the CPU that reported them.

The kernel prints a machine check it handles as (arch/x86/kernel/cpu/mce/core.c, __print_mce):

    mce: [Hardware Error]: CPU 12: Machine Check: 0 Bank 7: cc00008000010090
    mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000000402

the CPU, MCG_STATUS, the bank and its MCi_STATUS. MCi_STATUS bit 61 (UC) marks an error the hardware did not
correct, bit 57 (PCC) one that corrupted the processor's context (Intel SDM vol. 3B, 16.3.2.2; AMD's MCA_STATUS the
same bits). Corrected errors that go to mcelog or rasdaemon leave only "Machine check events logged" (counted, not
detailed: `mcelog --client` or `ras-mc-ctl --errors` show them).
"""

from __future__ import annotations

import re

MCE_RE = re.compile(r"CPU (\d+): Machine Check( Exception)?: ([0-9a-fA-F]+) Bank (\d+): ([0-9a-fA-F]{1,16})")
LOGGED = "Machine check events logged"
UC_BIT, PCC_BIT = 61, 57


def parse(messages: list[str]) -> dict:
    """{"events": [{"cpu", "bank", "status", "uncorrected", "context_corrupt", "exception", "message"}],
    "logged_lines": how many "Machine check events logged" lines} of the kernel log's messages."""
    events, logged = [], 0
    for line in messages:
        m = MCE_RE.search(line)
        if m is None:
            logged += LOGGED in line
            continue
        status = int(m.group(5), 16)
        events.append(
            {
                "cpu": int(m.group(1)),
                "bank": int(m.group(4)),
                "status": f"0x{status:016x}",
                "uncorrected": bool(status >> UC_BIT & 1),
                "context_corrupt": bool(status >> PCC_BIT & 1),
                "exception": bool(m.group(2)),
                "message": line.strip(),
            }
        )
    return {"events": events, "logged_lines": logged}
