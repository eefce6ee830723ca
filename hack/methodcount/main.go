// Command methodcount lists the types of Go packages whose method set (of the pointer type,
// so with the methods promoted through embedded fields) is larger than a bound: a type that
// reaches many methods is one object spread over many, hard for a newcomer to read.
//
//	go run ./hack/methodcount -max 20 ./internal/convservice/...
//
// It exits 1 when a type is over the bound. Types come from the packages' non-test files,
// type-checked against the export data `go list -export` builds (no golang.org/x/tools).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
)

type listedPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	DepOnly    bool
}

func main() {
	maxMethods := flag.Int("max", 20, "most methods a type may reach, promoted ones included")
	verbose := flag.Bool("v", false, "print every type with its count, not only those over the bound")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: methodcount [-max N] [-v] packages...")
		os.Exit(2)
	}
	over, err := run(flag.Args(), *maxMethods, *verbose, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "methodcount:", err)
		os.Exit(2)
	}
	if over > 0 {
		fmt.Printf("%d types reach more than %d methods\n", over, *maxMethods)
		os.Exit(1)
	}
}

// run reports the types over the bound and returns how many there are.
func run(patterns []string, maxMethods int, verbose bool, out io.Writer) (int, error) {
	pkgs, err := list(patterns)
	if err != nil {
		return 0, err
	}
	exports := map[string]string{}
	for _, p := range pkgs {
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	over := 0
	for _, p := range pkgs {
		if p.DepOnly || len(p.GoFiles) == 0 {
			continue
		}
		counts, err := methodCounts(fset, imp, p)
		if err != nil {
			return 0, err
		}
		for _, c := range counts {
			if c.n > maxMethods {
				over++
				fmt.Fprintf(out, "%s.%s: %d methods (more than %d)\n", p.ImportPath, c.name, c.n, maxMethods)
			} else if verbose {
				fmt.Fprintf(out, "%s.%s: %d methods\n", p.ImportPath, c.name, c.n)
			}
		}
	}
	return over, nil
}

type typeCount struct {
	name string
	n    int
}

// methodCounts type-checks one package and counts the method set of *T for each named type T.
func methodCounts(fset *token.FileSet, imp types.Importer, p listedPackage) ([]typeCount, error) {
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", name, err)
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: imp}
	pkg, err := conf.Check(p.ImportPath, fset, files, nil)
	if err != nil {
		return nil, fmt.Errorf("type-check %s: %w", p.ImportPath, err)
	}
	var counts []typeCount
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || tn.IsAlias() {
			continue
		}
		var ms *types.MethodSet
		if types.IsInterface(tn.Type()) {
			ms = types.NewMethodSet(tn.Type())
		} else {
			ms = types.NewMethodSet(types.NewPointer(tn.Type()))
		}
		counts = append(counts, typeCount{name: name, n: ms.Len()})
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i].n > counts[j].n })
	return counts, nil
}

// list runs `go list -export -deps -json` over the patterns.
func list(patterns []string) ([]listedPackage, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,GoFiles,Export,DepOnly"}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}
