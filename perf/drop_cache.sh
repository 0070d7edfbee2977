# Sourced by the perf scripts: drop_cache DIR... empties the page cache before a measured run and
# prints how -- "dropped" (/proc/sys/vm/drop_caches, when writable) or "fadvise" (posix_fadvise
# DONTNEED on every file of the given directories, what `k3flow bench` does where drop_caches is
# refused, e.g. in a container).
drop_cache() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo dropped; return; fi
  /usr/bin/python3 - "$@" <<'PY'
import os, sys
for d in sys.argv[1:]:
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
print("fadvise")
PY
}
