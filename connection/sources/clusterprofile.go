package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetgraph/fleetgraph/connection"
)

// The ClusterProfile source's name, and the API group and resource of the
// SIG-Multicluster cluster inventory API.
const (
	ClusterProfileSource   = "clusterprofile"
	ClusterProfileGroup    = "multicluster.x-k8s.io"
	ClusterProfileResource = "clusterprofiles"
)

// Extension names of the access-provider convention (KEP-5339): on a
// profile's access provider cluster, the exec plugin's per-cluster config
// and the extra arguments and environment a provider may allow.
const (
	execExtension      = "client.authentication.k8s.io/exec"
	extraArgsExtension = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args"
	extraEnvExtension  = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs"
)

// ProviderFile is the access-provider file of the cluster inventory API
// (--clusterprofile-provider-file): the exec plugins this consumer may run,
// by provider name.
type ProviderFile struct {
	Providers []Provider `json:"providers"`
}

// Provider is one access provider: how to get credentials for the
// clusters whose profiles offer it.
type Provider struct {
	Name       string                  `json:"name"`
	ExecConfig *clientcmdv1.ExecConfig `json:"execConfig"`
	// ProfileSourcedCLIArgsPolicy is "Append" to add a profile's extra
	// arguments, or "Ignore" (the default).
	ProfileSourcedCLIArgsPolicy string `json:"profileSourcedCLIArgsPolicy,omitempty"`
	// ProfileSourcedEnvVarsPolicy is "AppendIfNotExists", "Replace" or
	// "Ignore" (the default).
	ProfileSourcedEnvVarsPolicy string `json:"profileSourcedEnvVarsPolicy,omitempty"`
}

// LoadProviderFile reads and checks an access-provider file.
func LoadProviderFile(path string) (*ProviderFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("clusterprofile provider file: %w", err)
	}
	var f ProviderFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("clusterprofile provider file %s: %w", path, err)
	}
	if len(f.Providers) == 0 {
		return nil, fmt.Errorf("clusterprofile provider file %s lists no providers", path)
	}
	for i, p := range f.Providers {
		switch {
		case p.Name == "":
			return nil, fmt.Errorf("clusterprofile provider file %s: provider %d has no name", path, i)
		case p.ExecConfig == nil || p.ExecConfig.Command == "":
			return nil, fmt.Errorf("clusterprofile provider file %s: provider %q has no execConfig command", path, p.Name)
		}
		switch p.ProfileSourcedCLIArgsPolicy {
		case "", "Ignore", "Append":
		default:
			return nil, fmt.Errorf("clusterprofile provider file %s: provider %q: unknown profileSourcedCLIArgsPolicy %q", path, p.Name, p.ProfileSourcedCLIArgsPolicy)
		}
		switch p.ProfileSourcedEnvVarsPolicy {
		case "", "Ignore", "AppendIfNotExists", "Replace":
		default:
			return nil, fmt.Errorf("clusterprofile provider file %s: provider %q: unknown profileSourcedEnvVarsPolicy %q", path, p.Name, p.ProfileSourcedEnvVarsPolicy)
		}
	}
	return &f, nil
}

// clusterProfile is the part of a ClusterProfile fleetgraph reads.
type clusterProfile struct {
	Status struct {
		AccessProviders []accessProvider `json:"accessProviders,omitempty"`
		// CredentialProviders is the field's name before v0.1 of the
		// API; profiles may still carry it.
		CredentialProviders []accessProvider `json:"credentialProviders,omitempty"`
		Properties          []struct {
			Name  string `json:"name"`
			Value string `json:"value"`
		} `json:"properties,omitempty"`
	} `json:"status"`
}

type accessProvider struct {
	Name    string              `json:"name"`
	Cluster clientcmdv1.Cluster `json:"cluster"`
}

// NewClusterProfiles returns the source of SIG-Multicluster ClusterProfiles
// (multicluster.x-k8s.io). Each is a cluster named after it, labelled with
// its labels and its properties that are valid labels, and reached through
// the first access provider of Options.ProviderFile that its status offers:
// the profile gives the server and CA, the provider's exec plugin gives
// the credentials, as the cluster inventory API's consumers do.
func NewClusterProfiles(opts Options) Source { return &profileSource{opts: opts} }

type profileSource struct{ opts Options }

func (s *profileSource) Name() string { return ClusterProfileSource }

func (s *profileSource) Run(ctx context.Context, r *Registry) error {
	if s.opts.ProviderFile == "" {
		return fmt.Errorf("source %s needs an access-provider file (--clusterprofile-provider-file)", ClusterProfileSource)
	}
	providers, err := LoadProviderFile(s.opts.ProviderFile)
	if err != nil {
		return err
	}
	c, err := newClients(s.opts.Management)
	if err != nil {
		return err
	}
	w := newWatcher(ClusterProfileSource, r, logger(s.opts.Logger))
	gvr, ok := waitForResource(ctx, w, c.discovery, ClusterProfileGroup, ClusterProfileResource)
	if !ok {
		return nil
	}
	inf, err := dynamicInformer(c, w, gvr, s.opts.Namespace)
	if err != nil {
		return err
	}
	return w.run(ctx, func() []Claim {
		var out []Claim
		eachObject(inf, func(u *unstructured.Unstructured, cp *clusterProfile, err error) {
			out = append(out, profileClaim(providers, u, cp, err))
		})
		return out
	})
}

func profileClaim(providers *ProviderFile, u *unstructured.Unstructured, cp *clusterProfile, err error) Claim {
	ref := objectRef(u)
	labels := clusterLabels(ClusterProfileSource, u)
	if err == nil {
		for _, p := range cp.Status.Properties {
			_, taken := labels[p.Name]
			if !taken && len(validation.IsQualifiedName(p.Name)) == 0 && len(validation.IsValidLabelValue(p.Value)) == 0 {
				labels[p.Name] = p.Value
			}
		}
	}
	c := Claim{Object: ref, Cluster: clusterName(u, u.GetName()), Labels: labels}
	if err != nil {
		c.Config, c.Version = failing(err), "invalid"
		return c
	}
	cfg, version, err := profileRESTConfig(providers, cp)
	if err != nil {
		c.Config, c.Version = failing(fmt.Errorf("ClusterProfile %s: %w", ref, err)), "invalid"
		return c
	}
	c.Config = func(context.Context) (*rest.Config, error) { return rest.CopyConfig(cfg), nil }
	c.Version = version
	return c
}

// profileRESTConfig builds the client config of a profile from the first
// provider of the file that the profile offers, and a version that changes
// when the profile's entry for that provider does.
func profileRESTConfig(providers *ProviderFile, cp *clusterProfile) (*rest.Config, string, error) {
	offered := map[string]accessProvider{}
	for _, ap := range cp.Status.CredentialProviders {
		offered[ap.Name] = ap
	}
	for _, ap := range cp.Status.AccessProviders {
		offered[ap.Name] = ap // the current field wins over the deprecated one
	}
	if len(offered) == 0 {
		return nil, "", errors.New("its status lists no access providers yet")
	}
	var p *Provider
	var ap accessProvider
	for i := range providers.Providers {
		if a, ok := offered[providers.Providers[i].Name]; ok {
			p, ap = &providers.Providers[i], a
			break
		}
	}
	if p == nil {
		names := make([]string, len(providers.Providers))
		for i, pr := range providers.Providers {
			names[i] = pr.Name
		}
		return nil, "", fmt.Errorf("it offers access providers %s, but the provider file configures %s", sortedKeys(offered), quoteJoin(names, ", "))
	}
	raw, err := json.Marshal(ap)
	if err != nil {
		return nil, "", fmt.Errorf("access provider %q: %w", ap.Name, err)
	}
	sum := sha256.Sum256(raw)
	version := ap.Name + " " + hex.EncodeToString(sum[:8])

	cl := ap.Cluster
	if cl.Server == "" {
		return nil, "", fmt.Errorf("access provider %q has no cluster server", ap.Name)
	}
	cfg := &rest.Config{
		Host: cl.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: cl.CertificateAuthorityData, Insecure: cl.InsecureSkipTLSVerify, ServerName: cl.TLSServerName,
		},
		DisableCompression: cl.DisableCompression,
	}
	if err := connection.CheckCA(cfg); err != nil {
		return nil, "", fmt.Errorf("access provider %q: %w", ap.Name, err)
	}
	if cl.ProxyURL != "" {
		proxy, err := url.Parse(cl.ProxyURL)
		if err != nil {
			return nil, "", fmt.Errorf("access provider %q: proxy-url: %w", ap.Name, err)
		}
		cfg.Proxy = func(*http.Request) (*url.URL, error) { return proxy, nil }
	}
	exec, err := execConfig(p, &cl)
	if err != nil {
		return nil, "", fmt.Errorf("access provider %q: %w", ap.Name, err)
	}
	cfg.ExecProvider = exec
	return cfg, version, nil
}

// execConfig is the provider's exec plugin for one cluster: the profile's
// extra arguments and environment are added as the provider's policies
// allow, and the profile's exec extension is passed to the plugin as its
// cluster config.
func execConfig(p *Provider, cl *clientcmdv1.Cluster) (*clientcmdapi.ExecConfig, error) {
	e := p.ExecConfig
	out := &clientcmdapi.ExecConfig{
		Command: e.Command, Args: slices.Clone(e.Args), APIVersion: e.APIVersion,
		InstallHint: e.InstallHint, ProvideClusterInfo: e.ProvideClusterInfo,
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}
	env := map[string]string{}
	var order []string
	for _, v := range e.Env {
		if _, ok := env[v.Name]; !ok {
			order = append(order, v.Name)
		}
		env[v.Name] = v.Value
	}
	for _, ext := range cl.Extensions {
		raw := ext.Extension.Raw
		switch ext.Name {
		case execExtension:
			out.Config = &runtime.Unknown{Raw: slices.Clone(raw), ContentType: runtime.ContentTypeJSON}
		case extraArgsExtension:
			if p.ProfileSourcedCLIArgsPolicy != "Append" {
				continue
			}
			var args []string
			if err := yaml.Unmarshal(raw, &args); err != nil {
				return nil, fmt.Errorf("extension %s: %w", extraArgsExtension, err)
			}
			out.Args = append(out.Args, args...)
		case extraEnvExtension:
			policy := p.ProfileSourcedEnvVarsPolicy
			if policy == "" || policy == "Ignore" {
				continue
			}
			var extra map[string]string
			if err := yaml.Unmarshal(raw, &extra); err != nil {
				return nil, fmt.Errorf("extension %s: %w", extraEnvExtension, err)
			}
			for _, k := range slices.Sorted(maps.Keys(extra)) {
				_, exists := env[k]
				if exists && policy == "AppendIfNotExists" {
					continue // the provider file's value wins
				}
				if !exists {
					order = append(order, k)
				}
				env[k] = extra[k]
			}
		}
	}
	for _, k := range order {
		out.Env = append(out.Env, clientcmdapi.ExecEnvVar{Name: k, Value: env[k]})
	}
	return out, nil
}
