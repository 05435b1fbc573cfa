// Command testtimes reads the output of `go test -json` and prints where
// the time went: every package by elapsed time, then the slowest top-level
// tests, as Markdown tables. .ci/test keeps one JSON file per step (named
// after the step) and prints these tables at its end, so that a slow CI
// run says which package and which test made it slow.
//
//	go run ./.ci/testtimes [-top 20] step.json...  (a directory: its *.json)
//	go run ./.ci/testtimes -failures step.json     (the output of what failed)
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// event is the part of a test2json event this command reads.
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events
	Test       string
	Elapsed    float64
	Output     string
}

// row is a package's or a test's time in one step.
type row struct {
	name, step, result string
	elapsed            float64
}

const module = "github.com/sluicehq/sluice"

func main() {
	top := flag.Int("top", 20, "how many of the slowest tests to list")
	failures := flag.Bool("failures", false, "print the output of the tests and packages that failed, and nothing else")
	flag.Parse()
	var files []string
	for _, a := range flag.Args() {
		if st, err := os.Stat(a); err == nil && st.IsDir() {
			m, _ := filepath.Glob(filepath.Join(a, "*.json"))
			files = append(files, m...)
			continue
		}
		files = append(files, a)
	}
	var pkgs, tests []row
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			fail(err)
		}
		step := strings.TrimSuffix(filepath.Base(name), ".json")
		if *failures {
			err = printFailures(f, os.Stdout)
		} else {
			err = read(f, step, &pkgs, &tests)
		}
		f.Close()
		if err != nil {
			fail(fmt.Errorf("%s: %w", name, err))
		}
	}
	if *failures {
		return
	}
	table("package", pkgs, 0)
	table("test", tests, *top)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "testtimes:", err)
	os.Exit(1)
}

// read adds the packages and top-level tests that ended in r to pkgs and
// tests.
func read(r io.Reader, step string, pkgs, tests *[]row) error {
	return scan(r, func(e event) {
		if e.Action != "pass" && e.Action != "fail" && e.Action != "skip" {
			return
		}
		switch {
		case e.Test == "":
			*pkgs = append(*pkgs, row{e.Package, step, e.Action, e.Elapsed})
		case !strings.Contains(e.Test, "/"):
			*tests = append(*tests, row{e.Package + "." + e.Test, step, e.Action, e.Elapsed})
		}
	})
}

// printFailures writes the output of every test that failed, of every
// package that failed outside a test, and of builds that failed.
func printFailures(r io.Reader, w io.Writer) error {
	var events []event
	failed := map[string]bool{} // package + " " + test; test "" for the package
	err := scan(r, func(e event) {
		events = append(events, e)
		switch e.Action {
		case "fail":
			failed[e.Package+" "+e.Test] = true
		case "build-fail":
			failed[e.ImportPath+" build"] = true
		}
	})
	for _, e := range events {
		switch {
		case e.Action == "build-output" && failed[e.ImportPath+" build"]:
			fmt.Fprint(w, e.Output)
		case e.Action == "output" && e.Test != "" && failed[e.Package+" "+e.Test]:
			fmt.Fprint(w, e.Output)
		case e.Action == "output" && e.Test == "" && failed[e.Package+" "] && !strings.HasPrefix(e.Output, "=== "):
			fmt.Fprint(w, e.Output)
		}
	}
	return err
}

func scan(r io.Reader, f func(event)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // not an event: go test's own line
		}
		f(e)
	}
	return sc.Err()
}

// table prints rows, slowest first (the first n when n > 0), and their
// sum.
func table(what string, rows []row, n int) {
	total := 0.0
	for _, r := range rows {
		total += r.elapsed
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].elapsed > rows[j].elapsed })
	all := len(rows)
	if n > 0 && len(rows) > n {
		rows = rows[:n]
	}
	fmt.Printf("| %s | step | seconds | result |\n|---|---|---:|---|\n", what)
	for _, r := range rows {
		name := strings.TrimPrefix(strings.TrimPrefix(r.name, module), "/")
		if name == "" || strings.HasPrefix(name, ".") {
			name = "(root)" + name
		}
		fmt.Printf("| %s | %s | %.1f | %s |\n", name, r.step, r.elapsed, r.result)
	}
	fmt.Printf("| all %d | | %.1f | |\n\n", all, total)
}
