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
	for _, dir := range []string{".", "limiter"} {
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
