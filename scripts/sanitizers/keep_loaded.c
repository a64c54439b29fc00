/* Preloaded by scripts/sanitize.sh (address): dlclose does nothing, so the Open MPI components
   that MPI_Finalize unloads stay mapped and LeakSanitizer can name the module of an allocation
   made in one (a stack into an unloaded module prints as "<unknown module>", which no
   suppression can match). The process exits right after, so keeping them loaded costs nothing. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
