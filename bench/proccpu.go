package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU time from /proc, for the fleet's Postgres CPU per decision. Postgres
// runs on the benchmark machine, so its processes' CPU times are there to
// read; where it does not (another machine, another PID namespace), the
// fleet says so and leaves the columns empty.

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat:
// 100 on every Linux (the kernel converts to it whatever its own HZ).
const clockTicks = 100

// ticks converts a number of clock ticks to a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// procStat is what the fleet reads of /proc/<pid>/stat.
type procStat struct {
	comm string
	ppid int
	// utime and stime are the process's own CPU time in user and kernel
	// mode; cutime and cstime those of its children that exited and that
	// it waited for. All in clock ticks.
	utime, stime, cutime, cstime int64
}

// own is the process's own CPU time in clock ticks.
func (s procStat) own() int64 { return s.utime + s.stime }

// parseProcStat parses the one line of /proc/<pid>/stat (proc(5)). The
// command name, field 2, is in parentheses and may itself hold spaces
// and parentheses, so the fields after it are counted from its last ')'.
func parseProcStat(line string) (procStat, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc stat %q: no command name", line)
	}
	f := strings.Fields(line[end+1:])
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc stat %q: %d fields after the command name, want at least 15", line, len(f))
	}
	s := procStat{comm: line[open+1 : end]}
	var err error
	num := func(field int) int64 {
		n, e := strconv.ParseInt(f[field-3], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("/proc stat field %d %q: %w", field, f[field-3], e)
		}
		return n
	}
	s.ppid = int(num(4))
	s.utime, s.stime, s.cutime, s.cstime = num(14), num(15), num(16), num(17)
	return s, err
}

// readProcStat reads the stat of process pid.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(strings.TrimSpace(string(b)))
}

// treeCPU is the CPU time, in clock ticks, that process root and its
// children have used so far: root's own, that of its children still
// running, and that of its children that have exited (root's cutime and
// cstime, once it has waited for them). For the postmaster that is the
// whole server: every backend and background process is its child, and
// it waits for each one that exits, so the difference of two calls counts
// a backend that exited in between in full.
//
// A child that root waits for while the children are being read would be
// counted twice or not at all, so treeCPU reads root's stat before and
// after them and tries again when its children's total moved meanwhile.
// (A child that has exited but not been waited for is still readable.)
func treeCPU(root int) (int64, error) {
	var total int64
	for range 20 {
		before, err := readProcStat(root)
		if err != nil {
			return 0, err
		}
		children, err := childrenCPU(root)
		if err != nil {
			return 0, err
		}
		after, err := readProcStat(root)
		if err != nil {
			return 0, err
		}
		total = after.own() + after.cutime + after.cstime + children
		if before.cutime+before.cstime == after.cutime+after.cstime {
			break
		}
	}
	return total, nil
}

// childrenCPU is the own CPU time of root's children, in clock ticks.
func childrenCPU(root int) (int64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		if s, err := readProcStat(pid); err == nil && s.ppid == root {
			total += s.own()
		}
	}
	return total, nil
}

// pidsCPU reads the own CPU time of each of pids, in clock ticks. A pid
// that cannot be read (it has exited) is left out.
func pidsCPU(pids []int) map[int]int64 {
	m := make(map[int]int64, len(pids))
	for _, pid := range pids {
		if s, err := readProcStat(pid); err == nil {
			m[pid] = s.own()
		}
	}
	return m
}

// cpuDelta is the CPU time that the processes of after used since before:
// a process in both counts its increase, one only in after (started in
// between) counts in full. Processes only in before exited in between,
// and what they used since before is lost: lost counts them.
func cpuDelta(before, after map[int]int64) (delta int64, lost int) {
	for pid, t := range after {
		delta += t - before[pid]
	}
	for pid := range before {
		if _, ok := after[pid]; !ok {
			lost++
		}
	}
	return delta, lost
}

// errNotLocal says that Postgres's processes are not visible in /proc.
var errNotLocal = errors.New("the server's processes are not in this machine's /proc (another machine or PID namespace)")

// postmasterOf returns the postmaster of the backend with process id pid,
// or errNotLocal when the backend is not a local postgres process.
func postmasterOf(pid int) (int, error) {
	s, err := readProcStat(pid)
	if err != nil || s.comm != "postgres" {
		return 0, errNotLocal
	}
	pm, err := readProcStat(s.ppid)
	if err != nil || pm.comm != "postgres" {
		return 0, errNotLocal
	}
	return s.ppid, nil
}
