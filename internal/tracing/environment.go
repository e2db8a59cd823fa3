package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace/noop"
)

var noopTracer = noop.NewTracerProvider().Tracer(ScopeName)

// DefaultCallRatio is the share of calls without a sampled parent that start
// a trace of their own when OTEL_TRACES_SAMPLER is not set: small, because a
// node serves many calls and an operator traces them to find the slow few.
const DefaultCallRatio = 0.01

// Settings is tracing as the environment configures it.
type Settings struct {
	// On is false when no variable asks for tracing, or OTEL_SDK_DISABLED or
	// OTEL_TRACES_EXPORTER=none turns it off.
	On bool
	// Protocol is the OTLP protocol: "grpc" or "http/protobuf".
	Protocol string
	// Calls samples calls (and every span without a KindKey of transaction
	// or rollout).
	Calls sdktrace.Sampler
	// Batch tunes the exporting batcher.
	Batch BatchSettings
	// Exporter is where and how spans are sent.
	Exporter ExporterSettings
}

// ReadSettings reads the OTEL_* variables. Tracing is on when
// OTEL_TRACES_EXPORTER is otlp or an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
// OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off. A value
// this manager cannot use is an error naming the variable.
func ReadSettings(env func(string) string) (Settings, error) {
	get := func(k string) string { return strings.TrimSpace(env(k)) }
	if v := strings.ToLower(get("OTEL_SDK_DISABLED")); v != "" {
		disabled, err := strconv.ParseBool(v)
		if err != nil {
			return Settings{}, fmt.Errorf("OTEL_SDK_DISABLED=%q: want true or false", env("OTEL_SDK_DISABLED"))
		}
		if disabled {
			return Settings{}, nil
		}
	}
	s := Settings{}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return Settings{}, nil
	case "otlp":
		s.On = true
	case "":
		s.On = get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return Settings{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: this manager exports traces with otlp (or none)", env("OTEL_TRACES_EXPORTER"))
	}
	if !s.On {
		return Settings{}, nil
	}
	s.Protocol = "http/protobuf" // the OTLP exporter specification's default
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := get(k); v != "" {
			if v != "grpc" && v != "http/protobuf" {
				return Settings{}, fmt.Errorf("%s=%q: want grpc or http/protobuf", k, env(k))
			}
			s.Protocol = v
			break
		}
	}
	calls, err := callSampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return Settings{}, err
	}
	s.Calls = calls
	if s.Batch, err = readBatchSettings(env); err != nil {
		return Settings{}, err
	}
	if s.Exporter, err = readExporterSettings(s.Protocol, env); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// callSampler is the sampler OTEL_TRACES_SAMPLER names (with its argument),
// or parent-based with DefaultCallRatio for roots when it is not set.
func callSampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := func(def float64) (float64, error) {
		if arg == "" {
			return def, nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio between 0 and 1", arg)
		}
		return v, nil
	}
	switch strings.ToLower(name) {
	case "":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(DefaultCallRatio)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		r, err := ratio(1)
		return sdktrace.TraceIDRatioBased(r), err
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		r, err := ratio(1)
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), err
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", name)
}

// Sampler samples every transaction and rollout (a root span whose KindKey
// says so: they are few, and each is the record an operator looks for) and
// leaves every other span to calls.
func Sampler(calls sdktrace.Sampler) sdktrace.Sampler { return kindSampler{calls: calls} }

type kindSampler struct{ calls sdktrace.Sampler }

func (s kindSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	for _, a := range p.Attributes {
		if a.Key == KindKey {
			if v := a.Value.AsString(); v == KindTransaction || v == KindRollout {
				return sdktrace.AlwaysSample().ShouldSample(p)
			}
			break
		}
	}
	return s.calls.ShouldSample(p)
}

func (s kindSampler) Description() string {
	return "iteron{transactions,rollouts:AlwaysOn;calls:" + s.calls.Description() + "}"
}

// NewProvider is the tracer provider of settings s exporting to exp: the
// manager's batcher (NewBatcher) and sampler (Sampler), with opts added.
func NewProvider(exp sdktrace.SpanExporter, s Settings, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	calls := s.Calls
	if calls == nil {
		calls = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(DefaultCallRatio))
	}
	batch := s.Batch
	if batch == (BatchSettings{}) {
		batch = BatchSettings{DefaultScheduleDelay, DefaultExportTimeout, DefaultMaxQueueSize, DefaultMaxExportBatch}
	}
	return sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{
		sdktrace.WithSpanProcessor(NewBatcher(exp, batch)),
		sdktrace.WithSampler(Sampler(calls)),
		sdktrace.WithIDGenerator(IDGenerator()),
	}, opts...)...)
}

// FromEnvironment turns tracing on as the OTEL_* variables say, for the
// process service (a default for service.name: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES win). It returns the function that flushes and
// stops the exporter, which does nothing when tracing is off.
func FromEnvironment(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	s, err := ReadSettings(os.Getenv)
	if err != nil || !s.On {
		return func(context.Context) error { return nil }, err
	}
	exp, err := NewExporter(ctx, s.Exporter)
	if err != nil {
		return nil, fmt.Errorf("the OTLP trace exporter (%s): %w", s.Protocol, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := NewProvider(exp, s, sdktrace.WithResource(res))
	uninstall := Install(tp, Sampler(s.Calls))
	return func(ctx context.Context) error {
		Flush()
		uninstall()
		return tp.Shutdown(ctx)
	}, nil
}
