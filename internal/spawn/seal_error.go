package spawn

// SealError is why an executable was not sealed or not accepted as sealed.
type SealError struct {
	// Refused: the bytes are not the verified ones, or not runnable as such
	// (digest, size, file type, #! interpreter, seals): nothing may run them.
	Refused bool
	// Verification says the module's reason is verification_failed although
	// nothing was refused: the executable could not even be opened. (Every
	// refusal is verification_failed too.)
	Verification bool
	// Detail says what was wrong.
	Detail string
	// Err is the underlying error, if any.
	Err error
}

func (e *SealError) Error() string { return e.Detail }

// Unwrap returns the underlying error.
func (e *SealError) Unwrap() error { return e.Err }
