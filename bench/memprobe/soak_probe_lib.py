"""glibc mallinfo2 and RSS for the memory probes (Linux / glibc)."""
import ctypes
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
def heap():
    m = libc.mallinfo2()
    return {"heap_in_use": m.uordblks / 2**20, "heap_free": m.fordblks / 2**20, "arena": m.arena / 2**20,
            "mmap": m.hblkhd / 2**20}
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
