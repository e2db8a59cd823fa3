package analysis

import (
	"errors"
	"fmt"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// Kind is what a condition reads: the variables it may use.
type Kind int

// Condition kinds.
const (
	// KindPrometheus: `result` (list of double: the instant vector's
	// values, a scalar as a list of one) and `series` (list of maps with
	// `labels`, a map of strings, and `value`, a double).
	KindPrometheus Kind = iota
	// KindWebhook: `status` (int, the HTTP status) and `result` (the JSON
	// body; null when the body is empty).
	KindWebhook
	// KindProbe: `result` (the probe's terminal observation as JSON).
	KindProbe
)

func (k Kind) String() string {
	switch k {
	case KindPrometheus:
		return "prometheus"
	case KindWebhook:
		return "webhook"
	}
	return "probe"
}

// DefaultWebhookCondition is a webhook metric's condition when its spec
// gives none.
const DefaultWebhookCondition = "status >= 200 && status < 300"

// costLimit bounds one evaluation: a tenth of the API server's limit for a
// CRD validation rule, far more than a condition over a few thousand
// series costs (all() over 1 000 values costs about 5 000), and a few tens
// of milliseconds of the controller's time at most.
const costLimit = 100_000

// maxCached bounds the compiled conditions kept (a fleet controller sees a
// few per set; a node's manager a few per activation).
const maxCached = 256

// Condition is a compiled CEL condition of one kind.
type Condition struct {
	kind Kind
	expr string
	prg  cel.Program
}

// Expr is the condition's source.
func (c *Condition) Expr() string { return c.expr }

var (
	envOnce sync.Once
	envs    map[Kind]*cel.Env
	envErr  error

	cacheMu sync.Mutex
	cache   = map[cacheKey]*Condition{}
)

type cacheKey struct {
	kind Kind
	expr string
}

func environments() (map[Kind]*cel.Env, error) {
	envOnce.Do(func() {
		common := []cel.EnvOption{cel.CrossTypeNumericComparisons(true), cel.OptionalTypes()}
		decls := map[Kind][]cel.EnvOption{
			KindPrometheus: {
				cel.Variable("result", cel.ListType(cel.DoubleType)),
				cel.Variable("series", cel.ListType(cel.MapType(cel.StringType, cel.DynType))),
			},
			KindWebhook: {cel.Variable("status", cel.IntType), cel.Variable("result", cel.DynType)},
			KindProbe:   {cel.Variable("result", cel.DynType)},
		}
		envs = map[Kind]*cel.Env{}
		for k, d := range decls {
			env, err := cel.NewEnv(append(append([]cel.EnvOption{}, common...), d...)...)
			if err != nil {
				envErr = err
				return
			}
			envs[k] = env
		}
	})
	return envs, envErr
}

// Compile type-checks expr as a condition of kind: it must be a bool. The
// error is the CEL checker's, naming the line and column.
func Compile(kind Kind, expr string) (*Condition, error) {
	key := cacheKey{kind, expr}
	cacheMu.Lock()
	c, ok := cache[key]
	cacheMu.Unlock()
	if ok {
		return c, nil
	}
	all, err := environments()
	if err != nil {
		return nil, fmt.Errorf("the CEL environment: %w", err)
	}
	env := all[kind]
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("does not compile: %s", iss.Err())
	}
	if !ast.OutputType().IsExactType(types.BoolType) && ast.OutputType() != cel.DynType {
		return nil, fmt.Errorf("is of type %s; a condition must be a bool", ast.OutputType())
	}
	prg, err := env.Program(ast, cel.CostLimit(costLimit), cel.InterruptCheckFrequency(100))
	if err != nil {
		return nil, fmt.Errorf("cannot be planned: %w", err)
	}
	c = &Condition{kind: kind, expr: expr, prg: prg}
	cacheMu.Lock()
	if len(cache) >= maxCached {
		clear(cache)
	}
	cache[key] = c
	cacheMu.Unlock()
	return c, nil
}

// ErrNotBool is wrapped by an evaluation whose value is not a bool (an
// expression of type dyn that turned out otherwise).
var ErrNotBool = errors.New("the condition's value is not a bool")

// Eval evaluates the condition over vars (the kind's variables, as Go
// values: float64, []float64, map[string]any, []any, string, bool, nil,
// int64). An error is a condition that could not be evaluated: a missing
// key, a type error, the cost budget spent.
func (c *Condition) Eval(vars map[string]any) (bool, error) {
	out, _, err := c.prg.Eval(vars)
	if err != nil {
		return false, err
	}
	return asBool(out)
}

func asBool(v ref.Val) (bool, error) {
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%w: %v (%s)", ErrNotBool, v.Value(), v.Type().TypeName())
	}
	return b, nil
}
