// Command archgraph keeps docs/architecture.md's package diagram true: it reads the module's
// import graph from `go list` (every package's imports, and for packages that hold only tests,
// their test imports; every library's test imports are checked too, not drawn), reduces it to the edges no other path implies (a transitive reduction:
// what the diagram draws), checks that imports run one way (no cycle; nothing under internal/,
// pkg/ or examples/ imports controllers or cmd/), and either prints the diagram (-print) or checks
// that the document's mermaid block has exactly those packages and edges (-check FILE).
//
//	go run ./hack/archgraph -print                    # the mermaid edges, to paste
//	go run ./hack/archgraph -check docs/architecture.md  # what make verify runs
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
)

type goPackage struct {
	ImportPath   string
	Module       *struct{ Path string }
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func main() {
	print := flag.Bool("print", false, "print the mermaid edges of the reduced graph")
	check := flag.String("check", "", "check that this document's mermaid diagram matches the reduced graph")
	flag.Parse()
	graph, tests, err := load()
	if err == nil {
		err = oneWay(graph, tests)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "archgraph:", err)
		os.Exit(1)
	}
	reduced := reduce(graph)
	switch {
	case *print:
		writeMermaid(os.Stdout, graph, reduced)
	case *check != "":
		if err := checkDoc(*check, graph, reduced); err != nil {
			fmt.Fprintln(os.Stderr, "archgraph:", err)
			os.Exit(1)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

// load returns the module's packages and their imports of each other (relative paths).
func load() (map[string][]string, map[string][]string, error) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, nil, fmt.Errorf("go list: %v\n%s", err, ee.Stderr)
		}
		return nil, nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			return nil, nil, fmt.Errorf("go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0].Module == nil {
		return nil, nil, errors.New("no packages")
	}
	prefix := pkgs[0].Module.Path + "/"
	internal := func(name string, imports []string) []string {
		deps := []string{}
		for _, imp := range imports {
			if rel, ok := strings.CutPrefix(imp, prefix); ok && rel != name && !slices.Contains(deps, rel) {
				deps = append(deps, rel)
			}
		}
		sort.Strings(deps)
		return deps
	}
	graph := map[string][]string{}
	tests := map[string][]string{}
	imported := map[string]bool{}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p.ImportPath, prefix)
		graph[name] = internal(name, p.Imports)
		tests[name] = internal(name, append(append([]string{}, p.TestImports...), p.XTestImports...))
		for _, d := range graph[name] {
			imported[d] = true
		}
	}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p.ImportPath, prefix)
		if len(graph[name]) == 0 && !imported[name] {
			// A suite (test/chaos, test/e2e, internal/mqtt/conformance, ...): nothing imports it
			// and its code is its tests, so their imports are its edges. (Other packages' test
			// imports are not: the controllers' tests use test/testenv, which imports them.)
			graph[name] = tests[name]
		}
	}
	return graph, tests, nil
}

// library reports whether pkg is a library: it may not import, not even from its tests, the
// controllers or a command.
func library(pkg string) bool {
	return strings.HasPrefix(pkg, "internal/") || strings.HasPrefix(pkg, "pkg/") || strings.HasPrefix(pkg, "examples/agents")
}

// above reports whether d is the controllers or a command.
func above(d string) bool { return d == "controllers" || strings.HasPrefix(d, "cmd/") }

// oneWay fails on a cycle and on a library package that imports the controllers or a command,
// directly or through another package, from its code or from its tests (a library's test that
// needs the controllers is a suite's test: it belongs under test/ or controllers/).
func oneWay(graph, tests map[string][]string) error {
	var errs []error
	for pkg, deps := range tests {
		if !library(pkg) {
			continue
		}
		for _, d := range deps {
			if above(d) || reachesAbove(graph, d) {
				errs = append(errs, fmt.Errorf("%s's tests import %s, which is or imports the controllers or a command: move the test under test/ or controllers/", pkg, d))
			}
		}
	}
	for pkg, deps := range graph {
		for _, d := range deps {
			if library(pkg) && above(d) {
				errs = append(errs, fmt.Errorf("%s imports %s: libraries must not import the controllers or a command", pkg, d))
			}
			if reaches(graph, d, pkg, "") {
				errs = append(errs, fmt.Errorf("import cycle: %s -> %s -> ... -> %s", pkg, d, pkg))
			}
		}
	}
	return errors.Join(errs...)
}

// reachesAbove reports whether from imports, directly or not, the controllers or a command.
func reachesAbove(graph map[string][]string, from string) bool {
	return walk(graph, []string{from}, above)
}

// reaches reports whether to is reachable from from, not using the direct edge from -> skip.
func reaches(graph map[string][]string, from, to, skip string) bool {
	var starts []string
	for _, d := range graph[from] {
		if d != skip {
			starts = append(starts, d)
		}
	}
	return walk(graph, starts, func(n string) bool { return n == to })
}

// walk reports whether a package for which found is true is reachable from starts (included).
func walk(graph map[string][]string, starts []string, found func(string) bool) bool {
	seen := map[string]bool{}
	stack := slices.Clone(starts)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if found(n) {
			return true
		}
		if seen[n] {
			continue
		}
		seen[n] = true
		stack = append(stack, graph[n]...)
	}
	return false
}

// reduce keeps the edges that no longer path implies.
func reduce(graph map[string][]string) map[string][]string {
	out := map[string][]string{}
	for pkg, deps := range graph {
		out[pkg] = []string{}
		for _, d := range deps {
			if !reaches(graph, pkg, d, d) {
				out[pkg] = append(out[pkg], d)
			}
		}
	}
	return out
}

// nodeID is a package's mermaid node id.
func nodeID(pkg string) string { return strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(pkg) }

func writeMermaid(w io.Writer, graph, reduced map[string][]string) {
	var pkgs []string
	for p := range graph {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		if len(reduced[p]) == 0 {
			fmt.Fprintf(w, "  %s[%s]\n", nodeID(p), p)
		}
		for _, d := range reduced[p] {
			fmt.Fprintf(w, "  %s --> %s\n", nodeID(p), nodeID(d))
		}
	}
}

var (
	edgeLine = regexp.MustCompile(`^\s*([A-Za-z0-9_]+)(\[[^\]]*\])?\s*-->\s*([A-Za-z0-9_]+)(\[[^\]]*\])?\s*$`)
	nodeLine = regexp.MustCompile(`^\s*([A-Za-z0-9_]+)\[([^\]<]*)`)
)

// checkDoc compares the first mermaid block of path with the reduced graph: every package is a
// node, labelled with its path, and the arrows are exactly the reduced edges.
func checkDoc(path string, graph, reduced map[string][]string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	labels := map[string]string{} // node id -> package path from its label
	edges := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```mermaid"):
			in = true
			continue
		case in && strings.HasPrefix(line, "```"):
			in = false
		}
		if !in {
			continue
		}
		if m := nodeLine.FindStringSubmatch(line); m != nil {
			labels[m[1]] = strings.TrimSpace(m[2])
		}
		if m := edgeLine.FindStringSubmatch(line); m != nil {
			edges[m[1]+" --> "+m[3]] = true
		}
		if len(edges) > 0 && !in {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var problems []string
	want := map[string]bool{}
	for pkg, deps := range reduced {
		id := nodeID(pkg)
		if labels[id] != pkg {
			problems = append(problems, fmt.Sprintf("package %s: no node %s[%s ...] in the diagram", pkg, id, pkg))
		}
		for _, d := range deps {
			e := id + " --> " + nodeID(d)
			want[e] = true
			if !edges[e] {
				problems = append(problems, fmt.Sprintf("missing arrow %s (%s imports %s)", e, pkg, d))
			}
		}
	}
	for e := range edges {
		if !want[e] {
			from, to, _ := strings.Cut(e, " --> ")
			why := "not an import"
			for p := range graph {
				if nodeID(p) == from {
					for _, d := range graph[p] {
						if nodeID(d) == to {
							why = "implied by a longer path: drop it"
						}
					}
				}
			}
			problems = append(problems, fmt.Sprintf("arrow %s: %s", e, why))
		}
	}
	for id, label := range labels {
		if _, ok := graph[label]; !ok {
			problems = append(problems, fmt.Sprintf("node %s names %q, which is no package of the module", id, label))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("%s does not match the import graph (go run ./hack/archgraph -print shows it):\n  %s", path, strings.Join(problems, "\n  "))
	}
	return nil
}
