// Command sbom writes the software bill of materials of the a2a-fleet module as CycloneDX JSON
// (make release puts it in the bundle): the module itself at the VERSION given, and every module
// of its build list (`go list -m -json all`: what go.mod requires, directly or not, at the
// selected versions, replacements applied) with its package URL and go.sum hash, and the
// dependency graph between them (`go mod graph`, restricted to the selected versions). With
// -images, also each image archive of that folder (`docker save`, as make release writes them)
// as a container component that depends on the Debian packages installed in it (its dpkg
// database read from the image's files, pkg:deb purls with arch and distro).
//
//	go run ./hack/sbom -version "$(cat VERSION)" -commit "$(git rev-parse HEAD)" -images dist/images -o dist/sbom.cdx.json
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
	"runtime"
	"sort"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// module is one entry of `go list -m -json`.
type module struct {
	Path, Version, Sum string
	Main, Indirect     bool
	Replace            *module
}

func main() {
	version := flag.String("version", "", "the release version of the main module (the VERSION file)")
	commit := flag.String("commit", "", "the source commit the bundle is built from")
	out := flag.String("o", "", "output file (default: standard output)")
	images := flag.String("images", "", "a folder of image archives (docker save, gzip or not) whose Debian packages to list")
	flag.Parse()
	if *version == "" {
		fmt.Fprintln(os.Stderr, "sbom: -version is required")
		os.Exit(2)
	}
	bom, err := build(*version, *commit)
	if err == nil && *images != "" {
		err = addImages(bom, *images)
	}
	if err == nil {
		err = write(bom, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func build(version, commit string) (*cdx.BOM, error) {
	mods, err := listModules()
	if err != nil {
		return nil, err
	}
	graph, err := moduleGraph()
	if err != nil {
		return nil, err
	}
	bom := cdx.NewBOM()
	selected := map[string]string{} // module path@version (as go mod graph names it) -> bom-ref
	var components []cdx.Component
	var main *cdx.Component
	for _, m := range mods {
		c := component(m)
		if m.Main {
			c.Type = cdx.ComponentTypeApplication
			c.Version = version
			c.PackageURL = purl(m.Path, version)
			c.BOMRef = c.PackageURL
			if commit != "" {
				c.Properties = &[]cdx.Property{{Name: "vcs:commit", Value: commit}}
			}
			main = &c
			selected[m.Path] = c.BOMRef
			continue
		}
		selected[m.Path+"@"+m.Version] = c.BOMRef
		components = append(components, c)
	}
	if main == nil {
		return nil, errors.New("go list -m all names no main module")
	}
	bom.Metadata = &cdx.Metadata{
		Component: main,
		Properties: &[]cdx.Property{
			{Name: "go:toolchain", Value: runtime.Version()},
		},
	}
	bom.Components = &components
	deps := map[string][]string{}
	for _, e := range graph {
		from, okFrom := selected[e[0]]
		to, okTo := selected[e[1]]
		if okFrom && okTo {
			deps[from] = append(deps[from], to)
		}
	}
	refs := make([]string, 0, len(deps))
	for ref := range deps {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	dependencies := make([]cdx.Dependency, 0, len(refs))
	for _, ref := range refs {
		on := deps[ref]
		sort.Strings(on)
		dependencies = append(dependencies, cdx.Dependency{Ref: ref, Dependencies: &on})
	}
	bom.Dependencies = &dependencies
	return bom, nil
}

// component is a module as a CycloneDX library: the replacement when go.mod replaces it.
func component(m module) cdx.Component {
	path, version, sum := m.Path, m.Version, m.Sum
	var props []cdx.Property
	if m.Replace != nil {
		props = append(props, cdx.Property{Name: "go:replaces", Value: m.Path + "@" + m.Version})
		path, version, sum = m.Replace.Path, m.Replace.Version, m.Replace.Sum
	}
	if sum != "" {
		// go.sum's h1: hash (SHA-256 over the module's file list), not a hash of one file.
		props = append(props, cdx.Property{Name: "go:sum", Value: sum})
	}
	scope := cdx.ScopeRequired
	if m.Indirect {
		props = append(props, cdx.Property{Name: "go:indirect", Value: "true"})
	}
	c := cdx.Component{Type: cdx.ComponentTypeLibrary, Name: path, Version: version, Scope: scope, PackageURL: purl(path, version)}
	c.BOMRef = c.PackageURL
	if len(props) > 0 {
		c.Properties = &props
	}
	return c
}

// purl is the package URL of a Go module (github.com/package-url/purl-spec, type golang).
func purl(path, version string) string {
	if version == "" {
		return "pkg:golang/" + path
	}
	return "pkg:golang/" + path + "@" + version
}

func goCommand(args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func listModules() ([]module, error) {
	out, err := goCommand("list", "-m", "-json", "all")
	if err != nil {
		return nil, err
	}
	var mods []module
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m module
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return mods, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list -m -json: %w", err)
		}
		mods = append(mods, m)
	}
}

// moduleGraph is `go mod graph`: edges "path[@version] path@version".
func moduleGraph() ([][2]string, error) {
	out, err := goCommand("mod", "graph")
	if err != nil {
		return nil, err
	}
	var edges [][2]string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " ")
		if ok {
			edges = append(edges, [2]string{from, to})
		}
	}
	return edges, sc.Err()
}

func write(bom *cdx.BOM, path string) error {
	w := io.Writer(os.Stdout)
	if path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	enc := cdx.NewBOMEncoder(w, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return fmt.Errorf("encode the SBOM: %w", err)
	}
	return nil
}
