package slidingratelimit

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"
)

// The house rules of issue 23, held by the code itself: no function over
// maxFuncLines lines in the adapter or the engine, and a Handler of its
// documented configuration and what Provision builds, at most
// maxHandlerFields fields.
const (
	maxFuncLines     = 80
	maxHandlerFields = 30
)

// parseSources parses the non-test Go files of dir.
func parseSources(t *testing.T, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	notTest := func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }
	pkgs, err := parser.ParseDir(fset, dir, notTest, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	var files []*ast.File
	for _, p := range pkgs {
		for _, f := range p.Files {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return fset, files
}

// longFuncs lists the functions (declared or literal) of files longer than
// max lines, as "file:line name (n lines)".
func longFuncs(fset *token.FileSet, files []*ast.File, max int) []string {
	var long []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			var name string
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				name, body = fn.Name.Name, fn.Body
				if fn.Recv != nil && len(fn.Recv.List) == 1 {
					name = recvName(fn.Recv.List[0].Type) + "." + name
				}
			case *ast.FuncLit:
				name, body = "func literal", fn.Body
			default:
				return true
			}
			if body == nil {
				return true
			}
			start, end := fset.Position(n.Pos()), fset.Position(body.End())
			if lines := end.Line - start.Line + 1; lines > max {
				long = append(long, fmt.Sprintf("%s:%d %s (%d lines)", start.Filename, start.Line, name, lines))
			}
			return true
		})
	}
	return long
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

func TestNoFunctionOver80Lines(t *testing.T) {
	for _, dir := range []string{".", "limiter", "internal/reply", "internal/redisconf", "internal/limitmetrics", "httplimit", "internal/rls", "cmd/rls"} {
		fset, files := parseSources(t, dir)
		for _, l := range longFuncs(fset, files, maxFuncLines) {
			t.Errorf("%s: over %d lines; split it into named steps", l, maxFuncLines)
		}
	}
}

// TestLongFuncsFindsALongFunction keeps the check above honest: a function
// of 81 lines is named, one of 80 is not.
func TestLongFuncsFindsALongFunction(t *testing.T) {
	src := func(name string, lines int) string {
		return "func " + name + "() {\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", "package x\n"+src("ok", 80)+src("long", 81), 0)
	if err != nil {
		t.Fatal(err)
	}
	got := longFuncs(fset, []*ast.File{f}, maxFuncLines)
	if len(got) != 1 || !strings.Contains(got[0], " long (81 lines)") {
		t.Fatalf("longFuncs = %q, want only the 81-line function", got)
	}
}

// TestHandlerHoldsItsConfigAndOneValue checks the Handler: its documented
// configuration (the JSON fields) and one unexported value for what
// Provision builds, at most maxHandlerFields fields in all.
func TestHandlerHoldsItsConfigAndOneValue(t *testing.T) {
	_, files := parseSources(t, ".")
	var st *ast.StructType
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Handler" {
				st, _ = ts.Type.(*ast.StructType)
			}
			return st == nil
		})
	}
	if st == nil {
		t.Fatal("no struct type Handler in the root package")
	}
	var fields, unexported []string
	for _, f := range st.Fields.List {
		names := f.Names
		if len(names) == 0 { // embedded
			t.Errorf("Handler embeds %s: name its fields", typeName(f.Type))
			continue
		}
		for _, n := range names {
			fields = append(fields, n.Name)
			if !n.IsExported() {
				unexported = append(unexported, n.Name)
			} else if f.Tag == nil || !strings.Contains(f.Tag.Value, `json:"`) {
				t.Errorf("Handler.%s is exported with no json tag: configuration is JSON", n.Name)
			}
		}
	}
	if len(fields) > maxHandlerFields {
		t.Errorf("Handler has %d fields, want at most %d: configuration on one side, what Provision builds in its one unexported value", len(fields), maxHandlerFields)
	}
	if len(unexported) > 1 {
		t.Errorf("Handler has %d unexported fields %v, want one value for what Provision builds (put new state in it)", len(unexported), unexported)
	}
}

// typeName names a type expression for a message.
func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return "*" + typeName(t.X)
	case *ast.SelectorExpr:
		return typeName(t.X) + "." + t.Sel.Name
	case *ast.Ident:
		return t.Name
	}
	return "a type"
}

// TestNoFatalOffTheTestGoroutine: t.Fatal (FailNow, Skip) must be called
// from the test's own goroutine; from another it ends only that goroutine
// and the test goes on with what it had. In every test file, no goroutine
// calls it, directly or through a test helper (a function of the test
// files, or a method of internal/redistest, that may call it).
func TestNoFatalOffTheTestGoroutine(t *testing.T) {
	_, helpers := parseSources(t, "internal/redistest")
	for _, dir := range []string{".", "limiter", "internal/redistest", "internal/rls", "cmd/rls"} {
		fset := token.NewFileSet()
		tests := func(fi fs.FileInfo) bool { return strings.HasSuffix(fi.Name(), "_test.go") }
		pkgs, err := parser.ParseDir(fset, dir, tests, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", dir, err)
		}
		for _, p := range pkgs {
			var files []*ast.File
			for _, f := range p.Files {
				files = append(files, f)
			}
			fatal := mayFatal(append(files, helpers...))
			for _, at := range fatalInGoroutines(fset, files, fatal) {
				t.Errorf("%s: may t.Fatal off the test's goroutine: record with t.Error and return, or do it before the go statement", at)
			}
		}
	}
}

// fatalCall names a call to t.Fatal, t.Fatalf, t.FailNow or t.Skip*, on a
// *testing.T or testing.TB named t, tb or b.
func fatalCall(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok || (id.Name != "t" && id.Name != "tb" && id.Name != "b") {
		return false
	}
	switch sel.Sel.Name {
	case "Fatal", "Fatalf", "FailNow", "Skip", "Skipf", "SkipNow":
		return true
	}
	return false
}

// calleeName is the name of a call's function when it is a package-level
// function (not a local closure), or a method given the test's t
// (srv.CLI(t, ...)): "serve", "CLI".
func calleeName(c *ast.CallExpr) string {
	switch f := c.Fun.(type) {
	case *ast.Ident:
		if f.Obj == nil || f.Obj.Kind == ast.Fun {
			return f.Name
		}
	case *ast.SelectorExpr:
		for _, a := range c.Args {
			if id, ok := a.(*ast.Ident); ok && (id.Name == "t" || id.Name == "tb" || id.Name == "b") {
				return f.Sel.Name
			}
		}
	}
	return ""
}

// mayFatal lists the functions and methods of files that may call
// t.Fatal on their own goroutine, directly or through one another.
func mayFatal(files []*ast.File) map[string]bool {
	var decls []*ast.FuncDecl
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				decls = append(decls, fd)
			}
		}
	}
	fatal := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for _, fd := range decls {
			if fatal[fd.Name.Name] {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if _, ok := n.(*ast.GoStmt); ok {
					return false
				}
				if c, ok := n.(*ast.CallExpr); ok && (fatalCall(c) || fatal[calleeName(c)]) {
					fatal[fd.Name.Name], changed = true, true
				}
				return !fatal[fd.Name.Name]
			})
		}
	}
	return fatal
}

// fatalInGoroutines lists the places where a go statement's function
// calls t.Fatal or a function that may.
func fatalInGoroutines(fset *token.FileSet, files []*ast.File, fatal map[string]bool) []string {
	var at []string
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			g, ok := n.(*ast.GoStmt)
			if !ok {
				return true
			}
			ast.Inspect(g.Call, func(m ast.Node) bool {
				if c, ok := m.(*ast.CallExpr); ok && (fatalCall(c) || fatal[calleeName(c)]) {
					at = append(at, fmt.Sprintf("%s %s", fset.Position(c.Pos()), calleeName(c)))
				}
				return true
			})
			return true
		})
	}
	return at
}
