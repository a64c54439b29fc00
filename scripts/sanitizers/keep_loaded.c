/* Preloaded by scripts/sanitize.sh: dlclose does nothing, so the Open MPI components that
   MPI_Finalize unloads stay mapped until the process exits. Sanitizer suppressions match module
   names: a stack into an unloaded module prints as "<unknown module>" (no LeakSanitizer
   suppression can match it), and ThreadSanitizer ends the process when a library that matched a
   called_from_lib suppression is unloaded. The process exits right after, so keeping the
   modules loaded costs nothing. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
