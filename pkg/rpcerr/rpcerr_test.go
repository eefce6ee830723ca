package rpcerr

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// TestTable: every code and name is declared once: names are unique, a code has one
// definition per kind (the profile's binding codes share their numbers with A2A v1.0's, told
// apart by the name), sentinels and metric reasons are unique, and each named constant of this
// package is in the table with its name.
func TestTable(t *testing.T) {
	names, reasons, sentinels := map[string]bool{}, map[string]bool{}, map[error]bool{}
	codes := map[Kind]map[int]bool{}
	for _, d := range Table {
		if codes[d.Kind] == nil {
			codes[d.Kind] = map[int]bool{}
		}
		if codes[d.Kind][d.Code] {
			t.Errorf("code %d declared twice for kind %d", d.Code, d.Kind)
		}
		codes[d.Kind][d.Code] = true
		if (d.Kind == A2A) != (d.Name == "") {
			t.Errorf("code %d: A2A v1.0 codes have no a2a_error name, every other code has one (%q)", d.Code, d.Name)
		}
		if d.Name != "" && names[d.Name] {
			t.Errorf("name %q declared twice", d.Name)
		}
		names[d.Name] = true
		if d.Reason == "" || reasons[d.Reason] {
			t.Errorf("code %d: metric reason %q empty or declared twice", d.Code, d.Reason)
		}
		reasons[d.Reason] = true
		if d.Err == nil || sentinels[d.Err] {
			t.Errorf("code %d: sentinel %v missing or declared twice", d.Code, d.Err)
		}
		sentinels[d.Err] = true
	}
	for name, code := range map[string]int{
		NameRequestExpired: CodeRequestExpired, NameResponderUnavailable: CodeResponderUnavailable,
		NameTransportProtocolError: CodeTransportProtocolError, NameContextExpired: CodeContextExpired,
		NameConcurrencyLimit: CodeConcurrencyLimit, NameActiveContextsLimit: CodeActiveContextsLimit,
		NameContinuationMismatch: CodeContinuationMismatch, NameRateLimited: CodeRateLimited,
	} {
		if d, ok := Named(name); !ok || d.Code != code {
			t.Errorf("%s: table says %+v, constant %d", name, d, code)
		}
	}
}

// TestDeclaredOnlyHere walks the module's non-test Go code: no other package writes a JSON-RPC
// error code as a number or an a2a_error name as a string; they use this package's constants.
func TestDeclaredOnlyHere(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	here, _ := os.Getwd()
	fset := token.NewFileSet()
	var found []string
	err = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if path == here || e.Name() == "bin" || e.Name() == "testdata" || strings.HasPrefix(e.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.UnaryExpr:
				if lit, ok := x.X.(*ast.BasicLit); ok && x.Op == token.SUB && lit.Kind == token.INT {
					if v, err := strconv.Atoi(lit.Value); err == nil && v >= 31000 && v <= 32768 {
						found = append(found, fset.Position(x.Pos()).String()+": code -"+lit.Value)
					}
				}
			case *ast.BasicLit:
				if x.Kind == token.STRING {
					if s, err := strconv.Unquote(x.Value); err == nil {
						if _, ok := byName[s]; ok {
							found = append(found, fset.Position(x.Pos()).String()+": name "+x.Value)
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s: use pkg/rpcerr's constant", strings.TrimPrefix(f, root+"/"))
	}
}

func TestNamedRoundTrip(t *testing.T) {
	e := New(NameActiveContextsLimit, "full", map[string]any{"scope": "caller", "limit": 2})
	var back Error
	b, _ := json.Marshal(e)
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Code != CodeActiveContextsLimit || back.A2AError() != NameActiveContextsLimit || !errors.Is(&back, ErrActiveContextsLimit) ||
		back.Details()["scope"] != "caller" || back.Reason() != NameActiveContextsLimit || back.Retryable() || back.IsBindingError() {
		t.Fatalf("round trip %s: %+v", b, back)
	}
	if u := New(NameResponderUnavailable, "later", nil); !u.Retryable() || !u.IsBindingError() || !errors.Is(u, ErrResponderUnavailable) {
		t.Fatalf("responder_unavailable %+v", u)
	}
	// The same number without the name is A2A v1.0's UnsupportedOperation.
	a := NewA2A(a2a.ErrUnsupportedOperation, "no", map[string]any{"taskId": "T"}, time.Unix(0, 0))
	if a.Code != CodeResponderUnavailable || a.IsBindingError() || a.Retryable() || !errors.Is(a, a2a.ErrUnsupportedOperation) ||
		a.Details()["taskId"] != "T" || a.Reason() != "unsupported_operation" {
		t.Fatalf("A2A -32004 %+v", a)
	}
	if r := New(NameRateLimited, "slow down", map[string]any{"retry_after": 0.5}); r.Code != -32070 || !r.Retryable() {
		t.Fatalf("rate_limited %+v", r)
	}
}
