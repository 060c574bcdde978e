package graph

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

// LeafClients gives the live object(...) query a client config for a member
// cluster. The connection package implements it with the collector's own
// credentials; graph adds Impersonate-User and Impersonate-Group for the
// viewer, so those credentials need the verb impersonate on users and groups
// (and on userextras when identities carry extra fields).
//
// For a push-mode cluster the config's Transport may tunnel requests over
// the edge session; graph does not care how requests travel.
type LeafClients interface {
	// RESTConfig returns a config for the cluster's API server, or an error
	// when the cluster is unknown or not reachable now. graph copies the
	// config before changing it.
	RESTConfig(cluster string) (*rest.Config, error)
}

// Options configures NewHandler. Store, Authorizer and Authenticator are
// required; everything else has a safe default.
type Options struct {
	// Store is the fleet index: the only source of queries and
	// subscriptions.
	Store *index.Store
	// Authorizer computes what each viewer may see; normally
	// authz.NewAuthorizer(Store, ...).
	Authorizer *authz.Authorizer
	// Authenticator turns bearer tokens (HTTP Authorization header or the
	// websocket connection_init payload) and proxy headers into viewers.
	// Anonymous requests are rejected unless it is an *authz.Union with
	// AllowAnonymous.
	Authenticator authz.Authenticator
	// LeafClients serves object(...). Without it, object(...) answers with
	// a CLUSTER_UNAVAILABLE error.
	LeafClients LeafClients
	// AdminGroups are groups whose members are fleet admins: they see every
	// object and every cluster, including clusters whose RBAC has not been
	// collected yet. Everyone else sees what each cluster's RBAC grants.
	AdminGroups []string

	// Extensions are gqlgen handler extensions (tracing, for example)
	// installed after the built-in ones. One that intercepts fields
	// (graphql.FieldInterceptor) turns the Query.objects fast path off,
	// so that it sees every field; queries of objects then cost more.
	Extensions []graphql.HandlerExtension

	// Registry receives the package's Prometheus metrics and is what
	// /metrics serves. Nil means a private registry. Registering twice on
	// one registry fails, so give each handler its own. The package
	// registers no Go runtime or process collectors: whoever builds the
	// registry does.
	Registry *prometheus.Registry
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Ready is called by /readyz; nil means always ready. The server wires
	// it to "the index holds a first sync of every cluster" or similar.
	Ready func(ctx context.Context) error

	// DisableIntrospection turns off __schema and __type queries, for
	// production deployments that do not want the schema discoverable.
	// Introspection is on by default, which GraphiQL needs.
	DisableIntrospection bool
	// DisableGraphiQL stops serving the GraphiQL page at "/graphiql".
	DisableGraphiQL bool
	// DisableDashboard stops serving the dashboard at "/".
	DisableDashboard bool

	// Limits bound what one request may cost.
	Limits Limits
	// Websocket configures the websocket transport.
	Websocket WebsocketOptions
	// SubscriptionBuffer is how many change events may wait for one slow
	// subscription before it stops taking them from the fan-out and
	// catches up from the index's replay buffer instead; one that falls
	// out of that too ends with SLOW_CONSUMER (see
	// DefaultSubscriptionBuffer).
	SubscriptionBuffer int
}

// Limits bound the cost of one operation. Zero values take the defaults
// below; negative values are rejected by NewHandler.
type Limits struct {
	// MaxDepth bounds field nesting, counting introspection fields too.
	MaxDepth int
	// MaxComplexity bounds gqlgen's complexity, where objects(first: n)
	// costs n times its selection.
	MaxComplexity int
	// MaxAliases bounds aliased fields per document, which stops alias
	// floods that repeat a cheap field thousands of times.
	MaxAliases int
	// MaxTokens bounds the lexer tokens of a document, before parsing
	// builds anything.
	MaxTokens int
	// MaxBodyBytes bounds an HTTP request body; larger bodies get 413.
	MaxBodyBytes int64

	// ScanCost is the complexity added by an objects or facets field that
	// must visit every candidate row: a label selector, a name search, or
	// an order other than NAME. With MaxComplexity it bounds the scans one
	// document may ask for, however they are aliased.
	ScanCost int
	// FacetsCost is the complexity of a facets field without a scan
	// (per-cluster and per-namespace counts are summed for it).
	FacetsCost int
	// LiveReadCost is the complexity of an object(...) field, a round trip
	// to a cluster.
	LiveReadCost int

	// MaxSelectorBytes bounds a labelSelector or clusterLabelSelector in
	// bytes, checked before it is parsed.
	MaxSelectorBytes int
	// MaxSelectorTerms bounds the terms of a selector: each requirement,
	// and each value of an in or notin list beyond the first.
	MaxSelectorTerms int
	// MaxNameContains bounds filter.nameContains in bytes.
	MaxNameContains int
	// MaxFilterValues bounds each list of a filter (clusters, namespaces,
	// kinds, statuses).
	MaxFilterValues int

	// MaxScansPerViewer bounds the scans (see ScanCost) one viewer runs at
	// once; more wait for a slot until their deadline.
	MaxScansPerViewer int
	// MaxConcurrentScans bounds the scans the server runs at once, for all
	// viewers together; more wait. It keeps a core for everyone's cheap
	// reads however many viewers scan.
	MaxConcurrentScans int
	// MaxLiveReadsPerViewer bounds the object(...) reads one viewer has in
	// flight; more wait.
	MaxLiveReadsPerViewer int

	// RequestTimeout is the deadline of a query (over HTTP or a
	// websocket); its reads stop when it passes or the client goes away,
	// and it ends with DEADLINE_EXCEEDED. Subscriptions have none.
	RequestTimeout time.Duration
}

// The default limits. Depth 15 admits the introspection query of GraphiQL
// (graphql-js getIntrospectionQuery nests ofType deeply) while the schema's
// own types nest at most 5 levels. Complexity 50,000 admits a full page of
// 1,000 objects with every field. A legitimate dashboard uses a few dozen
// aliases at most.
const (
	DefaultMaxDepth      = 15
	DefaultMaxComplexity = 50000
	DefaultMaxAliases    = 64
	DefaultMaxTokens     = 10000
	DefaultMaxBodyBytes  = 1 << 20
)

// The default prices and bounds of reads. A scan of a 1M-object fleet
// costs tens of milliseconds of CPU, so 5,000 lets a document ask for at
// most nine (with a small selection) while a full page of 1,000 objects
// with every field still fits. A live read costs a round trip to a
// cluster: 1,000 allows 49 in one document. A selector of 4 KiB and 64
// terms is far beyond what people write; no Kubernetes name is longer than
// 253 bytes, so a longer nameContains can match nothing. Two scans per
// viewer let a dashboard refresh two views at once; the total of scans
// defaults to half the CPUs (at least one), so cheap reads always find a
// core.
const (
	DefaultScanCost              = 5000
	DefaultFacetsCost            = 100
	DefaultLiveReadCost          = 1000
	DefaultMaxSelectorBytes      = 4096
	DefaultMaxSelectorTerms      = 64
	DefaultMaxNameContains       = 253
	DefaultMaxFilterValues       = 1000
	DefaultMaxScansPerViewer     = 2
	DefaultMaxLiveReadsPerViewer = 4
	DefaultRequestTimeout        = 10 * time.Second
)

// DefaultMaxConcurrentScans is half the CPUs Go may use, at least one.
func DefaultMaxConcurrentScans() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// WebsocketOptions configures the websocket transport. Zero values take the
// defaults below.
type WebsocketOptions struct {
	// OriginPatterns are host patterns (path.Match syntax, e.g.
	// "*.example.com", or "https://dash.example.com" to pin the scheme)
	// whose pages may open websockets. The server's own origin is always
	// allowed; nil allows only it. Requests without an Origin header (not
	// from a browser) are allowed.
	OriginPatterns []string
	// InitTimeout is how long a client has to send connection_init; then
	// the socket closes with 4408.
	InitTimeout time.Duration
	// KeepAlive is the interval of graphql-ws "ka" messages and of
	// graphql-transport-ws pings (a client that does not pong within two
	// intervals is disconnected). It is also the read deadline of legacy
	// graphql-ws clients, which send nothing while they wait: they get a
	// websocket ping every interval, and a socket whose pong does not come
	// back within two intervals is closed with 1008.
	KeepAlive time.Duration
	// ReadLimit bounds one client message in bytes.
	ReadLimit int64
	// WriteTimeout bounds one message write; a client that does not read
	// for that long is disconnected (the transport half of the slow-client
	// policy).
	WriteTimeout time.Duration
	// MaxOperations bounds the operations (subscriptions and in-flight
	// queries) one connection may run at once; more get an error message
	// with code TOO_MANY_OPERATIONS. An event stream (server-sent events)
	// is one operation, and one viewer may hold at most MaxOperations
	// streams open at once (more get 429 TOO_MANY_OPERATIONS).
	// WriteTimeout and KeepAlive apply to event streams too.
	MaxOperations int
}

// The default websocket settings.
const (
	DefaultInitTimeout   = 10 * time.Second
	DefaultKeepAlive     = 25 * time.Second
	DefaultReadLimit     = 256 << 10
	DefaultWriteTimeout  = 10 * time.Second
	DefaultMaxOperations = 100
)

// DefaultSubscriptionBuffer is the default number of events a subscription
// may have pending: the index's stream default.
const DefaultSubscriptionBuffer = index.DefaultStreamBuffer

// withDefaults validates o and fills in defaults.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	if o.Store == nil {
		errs = append(errs, errors.New("graph: Options.Store is required"))
	}
	if o.Authorizer == nil {
		errs = append(errs, errors.New("graph: Options.Authorizer is required"))
	}
	if o.Authenticator == nil {
		errs = append(errs, errors.New("graph: Options.Authenticator is required"))
	}
	l := &o.Limits
	if l.MaxDepth < 0 || l.MaxComplexity < 0 || l.MaxAliases < 0 || l.MaxTokens < 0 || l.MaxBodyBytes < 0 ||
		l.ScanCost < 0 || l.FacetsCost < 0 || l.LiveReadCost < 0 || l.MaxSelectorBytes < 0 || l.MaxSelectorTerms < 0 ||
		l.MaxNameContains < 0 || l.MaxFilterValues < 0 || l.MaxScansPerViewer < 0 || l.MaxConcurrentScans < 0 ||
		l.MaxLiveReadsPerViewer < 0 || l.RequestTimeout < 0 {
		errs = append(errs, errors.New("graph: limits must not be negative"))
	}
	ws := &o.Websocket
	if ws.InitTimeout < 0 || ws.KeepAlive < 0 || ws.ReadLimit < 0 || ws.WriteTimeout < 0 || ws.MaxOperations < 0 || o.SubscriptionBuffer < 0 {
		errs = append(errs, errors.New("graph: websocket and subscription settings must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	setDefault(&o.Limits.MaxDepth, DefaultMaxDepth)
	setDefault(&o.Limits.MaxComplexity, DefaultMaxComplexity)
	setDefault(&o.Limits.MaxAliases, DefaultMaxAliases)
	setDefault(&o.Limits.MaxTokens, DefaultMaxTokens)
	setDefault(&o.Limits.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&l.ScanCost, DefaultScanCost)
	setDefault(&l.FacetsCost, DefaultFacetsCost)
	setDefault(&l.LiveReadCost, DefaultLiveReadCost)
	setDefault(&l.MaxSelectorBytes, DefaultMaxSelectorBytes)
	setDefault(&l.MaxSelectorTerms, DefaultMaxSelectorTerms)
	setDefault(&l.MaxNameContains, DefaultMaxNameContains)
	setDefault(&l.MaxFilterValues, DefaultMaxFilterValues)
	setDefault(&l.MaxScansPerViewer, DefaultMaxScansPerViewer)
	setDefault(&l.MaxConcurrentScans, DefaultMaxConcurrentScans())
	setDefault(&l.MaxLiveReadsPerViewer, DefaultMaxLiveReadsPerViewer)
	setDefault(&l.RequestTimeout, DefaultRequestTimeout)
	setDefault(&ws.InitTimeout, DefaultInitTimeout)
	setDefault(&ws.KeepAlive, DefaultKeepAlive)
	setDefault(&ws.ReadLimit, DefaultReadLimit)
	setDefault(&ws.WriteTimeout, DefaultWriteTimeout)
	setDefault(&ws.MaxOperations, DefaultMaxOperations)
	setDefault(&o.SubscriptionBuffer, DefaultSubscriptionBuffer)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return o, nil
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
