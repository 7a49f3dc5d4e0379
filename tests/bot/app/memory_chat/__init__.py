"""A chat front end kept in memory, with Mattermost's IDs: the files a new front end is."""
