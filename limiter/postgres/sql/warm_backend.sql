-- Run once on every new connection (see ConfigurePool): builds and drops a
-- 4 MiB string. glibc's malloc in the server process serves it with mmap
-- and, on freeing it, raises its dynamic mmap threshold to 4 MiB and its
-- trim threshold to 8 MiB; from then on the process keeps the memory its
-- transactions free instead of returning it to the kernel after each one
-- (brk) and faulting it in again in the next. On a busy machine each of
-- those returns costs a TLB shootdown across CPUs; they were the largest
-- single cost of a decide transaction under load. Elsewhere (another C
-- library) it is merely a string built once.
SELECT pg_catalog.length(pg_catalog.repeat('x', 4194304))
