package catalog

import (
	"io"
	"slices"
)

// Bounds of a catalog file (docs/reference/catalog.md).
const (
	// MaxCatalogBytes bounds a catalog file (512 KiB), checked before parsing.
	MaxCatalogBytes = 512 << 10
	// MaxManifests bounds the manifests of one catalog.
	MaxManifests = 256
	// CatalogSchemaVersion is the only catalog schema version.
	CatalogSchemaVersion = 1
)

type catalogWire struct {
	SchemaVersion   *uint32         `json:"schema_version"`
	Implementations *[]manifestWire `json:"implementations"`
}

// ParseCatalog parses a catalog file strictly and checks every rule of
// docs/reference/catalog.md: the size bound before parsing, schema version 1,
// at most 256 manifests with unique implementation IDs, each manifest within
// every bound, and dependency closure — a manifest that depends on an
// implementation the catalog lacks rejects the whole catalog. Absent argv,
// requested_capabilities and dependencies come back as empty lists.
func ParseCatalog(data []byte) (*Catalog, error) {
	c, err := parseCatalog(data)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ReadCatalog reads a catalog from r, never buffering more than
// MaxCatalogBytes+1 bytes, and parses it with ParseCatalog.
func ReadCatalog(r io.Reader) (*Catalog, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxCatalogBytes+1))
	if err != nil {
		return nil, err
	}
	return ParseCatalog(data)
}

func parseCatalog(data []byte) (*Catalog, *Error) {
	var w catalogWire
	if err := DecodeStrict(data, &w, MaxCatalogBytes, ""); err != nil {
		return nil, err
	}
	version, err := required("schema_version", w.SchemaVersion)
	if err != nil {
		return nil, err
	}
	if version != CatalogSchemaVersion {
		return nil, invalidf("schema_version", ErrUnsupportedVersion, "catalog schema version %d is not supported (1)", version)
	}
	wires, err := required("implementations", w.Implementations)
	if err != nil {
		return nil, err
	}
	if len(wires) > MaxManifests {
		return nil, invalidf("implementations", ErrTooLarge, "%d manifests exceed %d", len(wires), MaxManifests)
	}
	c := &Catalog{SchemaVersion: version, Implementations: make([]Manifest, 0, len(wires))}
	for i := range wires {
		m, err := wires[i].manifest(Index("implementations", i))
		if err != nil {
			return nil, err
		}
		c.Implementations = append(c.Implementations, m)
	}
	if err := checkCatalog(c); err != nil {
		return nil, err
	}
	return c, nil
}

// ValidateCatalog checks a catalog built in memory by the rules ParseCatalog
// applies to a file: schema version, count, every manifest, unique IDs and
// dependency closure.
func ValidateCatalog(c *Catalog) error {
	if c.SchemaVersion != CatalogSchemaVersion {
		return invalidf("schema_version", ErrUnsupportedVersion, "catalog schema version %d is not supported (1)", c.SchemaVersion)
	}
	if len(c.Implementations) > MaxManifests {
		return invalidf("implementations", ErrTooLarge, "%d manifests exceed %d", len(c.Implementations), MaxManifests)
	}
	for i, m := range c.Implementations {
		if err := validateManifest(Index("implementations", i), m); err != nil {
			return err
		}
	}
	if err := checkCatalog(c); err != nil {
		return err
	}
	return nil
}

// checkCatalog enforces unique implementation IDs and dependency closure.
func checkCatalog(c *Catalog) *Error {
	first := make(map[string]int, len(c.Implementations))
	for i, m := range c.Implementations {
		if j, dup := first[m.ImplementationID]; dup {
			return invalidf(Field(Index("implementations", i), "implementation_id"), ErrDuplicate,
				"%q is already implementations[%d]", m.ImplementationID, j)
		}
		first[m.ImplementationID] = i
	}
	for i, m := range c.Implementations {
		for j, d := range m.Dependencies {
			if _, ok := first[d.ImplementationID]; !ok {
				return invalidf(Field(Index(Field(Index("implementations", i), "dependencies"), j), "implementation_id"),
					ErrNotDependencyClosed, "%q depends on %q, which this catalog does not contain (a catalog must be dependency-closed)",
					m.ImplementationID, d.ImplementationID)
			}
		}
	}
	return nil
}

// Lookup returns the manifest with the given implementation_id.
func (c *Catalog) Lookup(implementationID string) (Manifest, bool) {
	i := slices.IndexFunc(c.Implementations, func(m Manifest) bool { return m.ImplementationID == implementationID })
	if i < 0 {
		return Manifest{}, false
	}
	return c.Implementations[i], true
}
