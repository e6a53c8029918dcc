package testkit

// The env table's defaults, for tests (#34): each default lives once, in
// the table (cmd/meshagent/config/env.go), and the services take every
// table value as a required field of their Config. A service's own tests
// cannot import the config package (it imports the services: an import
// cycle), so TableDefault reads the table's source instead: the entry
// `setting(kind, "NAME", default, ...)` and its default expression, a
// constant (24*time.Hour, 256<<20, "cluster.local", 0.5, true).

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"
)

// tableFile is the table, relative to the module's root.
const tableFile = "cmd/meshagent/config/env.go"

// TableDefault is the default of the table's variable name, as a T. A
// variable not in the table, a default that is not a constant or not a
// T fails the test.
func TableDefault[T string | bool | int | int64 | uint16 | float64 | time.Duration](t Failer, name string) T {
	t.Helper()
	v, err := tableValue(name, reflect.TypeFor[T]())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return v.Interface().(T)
}

// FillFromTable sets every field of the struct cfg points to whose tag
// names a variable of the table (`env:"SECRET_TTL"`) to that variable's
// default: a service's Config as cmd builds it with no variable set, for
// the service's own tests and others alike.
func FillFromTable(t Failer, cfg any) {
	t.Helper()
	v := reflect.ValueOf(cfg).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, ok := f.Tag.Lookup("env")
		if !ok {
			continue
		}
		val, err := tableValue(name, f.Type)
		if err != nil {
			t.Fatalf("%s.%s: %v", v.Type(), f.Name, err)
		}
		v.Field(i).Set(val)
	}
}

// tableValue is the default of the table's variable name as a value of
// typ (a string, bool, number or duration type).
func tableValue(name string, typ reflect.Type) (reflect.Value, error) {
	defaults, err := tableDefaults()
	if err != nil {
		return reflect.Value{}, fmt.Errorf("reading the env table: %w", err)
	}
	c, ok := defaults[name]
	if !ok {
		return reflect.Value{}, fmt.Errorf("%s: not a setting of the env table (%s) with a constant default", name, tableFile)
	}
	var val any
	switch k := c.Kind(); {
	case typ.Kind() == reflect.String && k == constant.String:
		val = constant.StringVal(c)
	case typ.Kind() == reflect.Bool && k == constant.Bool:
		val = constant.BoolVal(c)
	case typ.Kind() == reflect.Float64 && (k == constant.Float || k == constant.Int):
		val, _ = constant.Float64Val(constant.ToFloat(c))
	case typ.Kind() == reflect.Int || typ.Kind() == reflect.Int64 || typ.Kind() == reflect.Uint16:
		n, exact := constant.Int64Val(constant.ToInt(c))
		if !exact {
			return reflect.Value{}, fmt.Errorf("%s: the table's default %s is not a whole number", name, c)
		}
		val = n
	default:
		return reflect.Value{}, fmt.Errorf("%s: the table's default %s is not a %s", name, c, typ)
	}
	return reflect.ValueOf(val).Convert(typ), nil
}

// Failer is what TableDefault needs of its caller: a testing.TB, or
// ExitOnFatal in a test binary's helper process, which has no test.
type Failer interface {
	Helper()
	Fatalf(format string, args ...any)
}

var _ Failer = testing.TB(nil)

// ExitOnFatal is the Failer of a helper process (a TestMain that runs
// as a child): it prints the failure and exits 2.
type ExitOnFatal struct{}

func (ExitOnFatal) Helper() {}

func (ExitOnFatal) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

var tableDefaults = sync.OnceValues(func() (map[string]constant.Value, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, tableFile), nil, 0)
	if err != nil {
		return nil, err
	}
	out := map[string]constant.Value{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) < 3 {
			return true
		}
		if fn, ok := call.Fun.(*ast.Ident); !ok || fn.Name != "setting" {
			return true
		}
		lit, ok := call.Args[1].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		if v := constValue(call.Args[2]); v.Kind() != constant.Unknown {
			out[name] = v
		}
		return true
	})
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no setting(...) entries found", tableFile)
	}
	return out, nil
})

// timeUnits are the time package's constants a default may be written in.
var timeUnits = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// constValue evaluates a constant expression of the table; Unknown when
// it is not one.
func constValue(e ast.Expr) constant.Value {
	switch e := e.(type) {
	case *ast.BasicLit:
		return constant.MakeFromLiteral(e.Value, e.Kind, 0)
	case *ast.Ident:
		switch e.Name {
		case "true", "false":
			return constant.MakeBool(e.Name == "true")
		}
	case *ast.ParenExpr:
		return constValue(e.X)
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok && pkg.Name == "time" {
			if d, ok := timeUnits[e.Sel.Name]; ok {
				return constant.MakeInt64(int64(d))
			}
		}
	case *ast.BinaryExpr:
		x, y := constValue(e.X), constValue(e.Y)
		if x.Kind() == constant.Unknown || y.Kind() == constant.Unknown {
			break
		}
		if e.Op == token.SHL || e.Op == token.SHR {
			s, ok := constant.Uint64Val(y)
			if !ok {
				break
			}
			return constant.Shift(x, e.Op, uint(s))
		}
		return constant.BinaryOp(x, e.Op, y)
	}
	return constant.MakeUnknown()
}

// moduleRoot is the directory of go.mod above the working directory (a
// test's package directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}
